"""Shared test configuration.

Server fixtures live in ``tests/servers/`` (one module per family) and are loaded here, so every
test folder can use ``s3_server``, ``gcs_server``, ``azure_server``, ``storage_url_factory``,
``any_storage_url``, ``postgres_server`` and ``registry_url``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest_plugins = ["tests.servers.storage_fixtures", "tests.servers.postgres_fixtures"]
