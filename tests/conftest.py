"""Shared test configuration.

Server fixtures live in ``tests/servers/`` (one module per family) and are loaded here, so every
test folder can use ``s3_server``, ``gcs_server``, ``azure_server``, ``storage_url_factory``,
``any_storage_url``, ``local_and_s3_url``, ``postgres_server`` and ``registry_url``. Defined here:
``where`` / ``where_local_and_s3`` (a test's storage + registry). Plugins loaded here: with
``CI=true`` a skip fails (``tests/_helpers/ci_skips.py``); every test is marked ``unit``,
``servers`` or ``e2e`` (``tests/_helpers/markers.py``); the Keras 2, JAX and heavy end-to-end
(``tests/test_e2e_beside.py``) child pytest runs start as the session starts and run beside it
(``tests/_helpers/child_runs.py``). Helpers shared by several folders are in
``tests/_helpers/``; ``tests/test_layers.py`` checks each fixture and shared helper is defined once.
"""

import os
from typing import NamedTuple

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

pytest_plugins = [
    "tests.servers.storage_fixtures",
    "tests.servers.postgres_fixtures",
    "tests.servers.ray_cluster",  # ray_cluster: one two-node loopback cluster per session
    "tests._helpers.ci_skips",  # with CI=true a skip fails
    "tests._helpers.markers",  # unit / servers / e2e on every test
    "tests._helpers.child_runs",  # the child runs (Keras 2, JAX, heavy e2e) start with the session
    "pytester",  # tests/test_conftest_rules.py runs small test files
]

# Keras 2 only modules run in the Keras 2 child run of tests/keras_io/test_keras2_suite.py (which
# fails on any skip); a Keras 3 session leaves them out instead of listing them as skipped.
KERAS2_ONLY = [
    "keras_io/test_export_keras2.py",
    "keras_io/test_tf_bundle_keras2.py",
    "keras_io/test_graph_mode_keras2.py",
]
collect_ignore = (
    [] if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True") else KERAS2_ONLY
)


class Where(NamedTuple):
    """Where a test keeps its checkpoints and registry; unpacks as ``storage, registry``."""

    storage: str
    registry: str

    def core_kwargs(self) -> dict[str, object]:
        """``det.core.init(**where.core_kwargs())``: these places, no signal handlers installed."""
        return {"storage": self.storage, "registry": self.registry, "preempt_signals": False}


@pytest.fixture(scope="session", autouse=True)
def _docs_pages_start_with_the_session(request, tmp_path_factory) -> None:
    """When documentation pages are selected, their runs start with the first test and go on
    beside the others (tests/docs/test_examples.py: start_page_runs); their tests check them."""
    if any(
        getattr(item, "originalname", "") == "test_page_examples_run"
        for item in request.session.items
    ):
        from tests.docs.test_examples import start_page_runs

        start_page_runs(request, tmp_path_factory)


@pytest.fixture(autouse=True)
def _own_restore_cache(tmp_path_factory, monkeypatch) -> None:
    """Each test gets its own restore cache folder (created on first use; children inherit
    it), so no test passes because another one left a good copy of a chunk it damages."""
    import uuid

    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("CKPTSTORE_CACHE_DIR", str(base / f"restore-cache-{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def where(tmp_path, monkeypatch) -> Where:
    """Local storage and a fresh SQLite registry in ``tmp_path``, with no trial of an outer
    ``ckptstore`` run in the environment (a test run inside one must not join its trial)."""
    from ckptstore.core._info import ALL_ENV

    for name in ALL_ENV:
        monkeypatch.delenv(name, raising=False)
    return Where(str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'registry.db'}")


@pytest.fixture
def where_local_and_s3(tmp_path, local_and_s3_url) -> Where:
    """:func:`where` on local files and on the S3 emulator (the test runs once for each)."""
    return Where(local_and_s3_url, f"sqlite:///{tmp_path / 'registry.db'}")
