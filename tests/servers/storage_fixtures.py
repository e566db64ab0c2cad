"""Pytest fixtures for storage: loopback S3/GCS/Azure emulators and fresh storage URLs.

Fixtures (loaded for every test by ``tests/conftest.py``):

- ``s3_server``, ``gcs_server``, ``azure_server`` (session): a running emulator
  (:class:`tests.servers.emulators.ServerHandle`, with ``.endpoint`` and ``.env``). On start the
  process environment gets ``AWS_ENDPOINT_URL``/``AWS_ACCESS_KEY_ID``/... ,
  ``STORAGE_EMULATOR_HOST`` or ``AZURE_STORAGE_CONNECTION_STRING`` so ckptstore and
  subprocesses find the server. A server that cannot start skips the test (fails it with
  ``CI=true``: tests/_helpers/ci_skips.py).
- ``storage_url_factory``: ``make(kind)`` -> a fresh URL for kind in file/memory/s3/gcs/azure
  (own bucket or container per call, created; servers started lazily). ``file`` gives a plain
  absolute path.
- ``any_storage_url``: parametrized over the five kinds (ids file, memory, s3, gcs, azure).
- ``local_and_s3_url``: parametrized over file and s3.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.servers.emulators import ServerHandle, ServerStartError, create_bucket, start_server

KINDS = ("file", "memory", "s3", "gcs", "azure")


class _Servers:
    """Starts each emulator at most once per session, on first need."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.handles: dict[str, ServerHandle] = {}
        self.failures: dict[str, str] = {}
        self.saved_env: dict[str, str | None] = {}
        self.lock = threading.Lock()

    def get(self, kind: str) -> ServerHandle:
        with self.lock:
            if kind in self.handles:
                return self.handles[kind]
            if kind not in self.failures:
                try:
                    handle = start_server(kind, os.path.join(self.workdir, kind))
                except (ServerStartError, OSError) as exc:
                    self.failures[kind] = f"{kind} emulator could not start: {exc}"
                else:
                    for name, value in handle.env.items():
                        self.saved_env.setdefault(name, os.environ.get(name))
                        os.environ[name] = value
                    self.handles[kind] = handle
                    return handle
        pytest.skip(self.failures[kind])

    def stop_all(self) -> None:
        for handle in self.handles.values():
            handle.stop()
        self.handles.clear()
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def _storage_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Servers]:
    servers = _Servers(str(tmp_path_factory.mktemp("storage-servers")))
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture(scope="session")
def s3_server(_storage_servers: _Servers) -> ServerHandle:
    """moto's S3 server on 127.0.0.1 (env AWS_ENDPOINT_URL etc. set)."""
    return _storage_servers.get("s3")


@pytest.fixture(scope="session")
def gcs_server(_storage_servers: _Servers) -> ServerHandle:
    """fake-gcs-server on 127.0.0.1 (env STORAGE_EMULATOR_HOST set)."""
    return _storage_servers.get("gcs")


@pytest.fixture(scope="session")
def azure_server(_storage_servers: _Servers) -> ServerHandle:
    """Azurite blob service on 127.0.0.1 (env AZURE_STORAGE_CONNECTION_STRING set)."""
    return _storage_servers.get("azure")


@pytest.fixture
def storage_url_factory(
    _storage_servers: _Servers, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], str]:
    """``make(kind)`` -> a fresh, empty storage URL of that kind."""

    def make(kind: str) -> str:
        token = uuid.uuid4().hex[:12]
        if kind == "file":
            return str(tmp_path_factory.mktemp("storage") / "store")
        if kind == "memory":
            return f"memory://test-{token}/root"
        if kind not in ("s3", "gcs", "azure"):
            raise ValueError(f"unknown storage kind {kind!r}; use one of {KINDS}")
        server = _storage_servers.get(kind)
        bucket = f"ckpt-{token}"
        create_bucket(server, bucket)
        scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[kind]
        return f"{scheme}://{bucket}/root"

    return make


@pytest.fixture(params=KINDS)
def any_storage_url(request: pytest.FixtureRequest, storage_url_factory) -> str:
    """A fresh URL on each of file, memory, s3, gcs, azure."""
    return storage_url_factory(request.param)


@pytest.fixture(params=("file", "s3"))
def local_and_s3_url(request: pytest.FixtureRequest, storage_url_factory) -> str:
    """A fresh URL on local files and on S3."""
    return storage_url_factory(request.param)
