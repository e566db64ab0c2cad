"""Shared test configuration.

Server fixtures live in ``tests/servers/`` (one module per family) and are loaded here, so every
test folder can use ``s3_server``, ``gcs_server``, ``azure_server``, ``storage_url_factory``,
``any_storage_url``, ``postgres_server`` and ``registry_url``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest_plugins = ["tests.servers.storage_fixtures", "tests.servers.postgres_fixtures"]

# Keras 2 only modules run in the Keras 2 child run of tests/keras_io/test_keras2_suite.py (which
# fails on any skip); a Keras 3 session leaves them out instead of listing them as skipped.
KERAS2_ONLY = ["keras_io/test_export_keras2.py", "keras_io/test_tf_bundle_keras2.py"]
collect_ignore = (
    [] if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True") else KERAS2_ONLY
)
