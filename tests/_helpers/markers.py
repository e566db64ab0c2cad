"""Every test gets one of the markers ``unit``, ``servers``, ``e2e`` (registered in
pyproject.toml), so a developer can run the quick ones alone::

    pytest -m unit              # in-process tests on local files and SQLite
    pytest -m servers           # S3 / GCS / Azure emulators, PostgreSQL (started by fixtures)
    pytest -m e2e               # processes, training end to end, browsers, Ray clusters

- ``e2e``: marked so explicitly (``pytestmark = pytest.mark.e2e`` on a module that starts
  processes or trains models end to end), marked ``slow``, or using a fixture that starts a
  browser or a cluster (:data:`E2E_FIXTURES`).
- ``servers``: needs a storage emulator or PostgreSQL (:func:`needs_server`). A test can be both.
- ``unit``: neither.
"""

from __future__ import annotations

import pytest

#: Fixtures that start a server for every test that uses them.
SERVER_FIXTURES = frozenset({"s3_server", "gcs_server", "azure_server", "postgres_server"})
#: Fixtures that make a storage or registry URL of the kind their parameter names: a server only
#: for the server kinds (the param values listed are the local ones).
LOCAL_PARAMS = {
    "any_storage_url": frozenset({"file", "memory"}),
    "local_and_s3_url": frozenset({"file"}),
    "registry_url": frozenset({"sqlite"}),
}
#: A factory of URLs of any kind: used outside the fixtures above, it may start any server.
FACTORY = "storage_url_factory"
#: Fixtures that start a browser or a cluster of processes.
E2E_FIXTURES = frozenset({"ray_cluster", "browser"})


def needs_server(item: pytest.Item) -> bool:
    """Whether ``item`` starts (or may start) a storage emulator or PostgreSQL."""
    names = set(getattr(item, "fixturenames", ()))
    if names & SERVER_FIXTURES:
        return True
    params = item.callspec.params if hasattr(item, "callspec") else {}
    for name, local in LOCAL_PARAMS.items():
        if name in names and params.get(name) not in local:
            return True
    # Who asks for the factory: the test itself or a fixture other than LOCAL_PARAMS's.
    info = getattr(item, "_fixtureinfo", None)
    if info is None or FACTORY not in names:
        return False
    requesters = [info.argnames]
    for name in names - set(LOCAL_PARAMS):
        definitions = info.name2fixturedefs.get(name)
        if definitions:
            requesters.append(definitions[-1].argnames)
    return any(FACTORY in argnames for argnames in requesters)


def is_e2e(item: pytest.Item) -> bool:
    if item.get_closest_marker("e2e") or item.get_closest_marker("slow"):
        return True
    return bool(set(getattr(item, "fixturenames", ())) & E2E_FIXTURES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        e2e, servers = is_e2e(item), needs_server(item)
        if e2e and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)
        if servers:
            item.add_marker(pytest.mark.servers)
        if not (e2e or servers):
            item.add_marker(pytest.mark.unit)
