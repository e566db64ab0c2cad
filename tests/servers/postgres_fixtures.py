"""PostgreSQL fixtures: a real throw-away server on 127.0.0.1 for the whole test session.

- ``postgres_server`` (session): a fresh cluster made with ``initdb`` in a temp folder and started
  with ``pg_ctl`` on a free loopback port (trust auth, ``fsync=off``). As root, the server runs as
  the ``postgres`` user. Stopped and removed at session end (a detached watchdog does it if the
  test process is killed). If it cannot start, tests using it
  are skipped (failed with ``CI=true``: tests/_helpers/ci_skips.py).
- ``postgres_url_factory``: ``make() -> str``, each call creates a new empty database and returns
  its ``postgresql://`` URL.
- ``registry_url``: a registry URL parametrized over ``sqlite`` (a file in ``tmp_path``) and
  ``postgresql`` (a fresh database).

Example::

    def test_something(registry_url):
        with Registry(registry_url) as registry:
            ...
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests._helpers.ports import free_port

_BINARIES = ("initdb", "pg_ctl", "postgres")


@dataclasses.dataclass
class PostgresServer:
    """A running test server. ``url(dbname)`` gives a ``postgresql://`` URL for a database."""

    host: str
    port: int
    user: str
    data_dir: str

    def url(self, dbname: str = "postgres", password: str | None = None) -> str:
        auth = self.user if password is None else f"{self.user}:{password}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}"

    def create_database(self) -> str:
        """Create a fresh database and return its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _find_bindir() -> str | None:
    candidates: list[str] = []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    try:
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found:
            candidates.append(os.path.dirname(os.path.realpath(found)))
    for bindir in candidates:
        if bindir and all(os.access(os.path.join(bindir, b), os.X_OK) for b in _BINARIES):
            return bindir
    return None


def _as_server_user(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as ``postgres`` then."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", subprocess.list2cmdline(cmd)]


def _run(cmd: list[str], timeout: float = 120) -> None:
    proc = subprocess.run(_as_server_user(cmd), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{os.path.basename(cmd[0])} failed ({proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )


def _start_server(base: str) -> PostgresServer:
    bindir = _find_bindir()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL binaries (initdb, pg_ctl, postgres) not found under "
            "/usr/lib/postgresql/*/bin, `pg_config --bindir` or PATH; install the `postgresql` "
            "package (apt-get install postgresql)"
        )
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")  # KeyError -> reported by the caller
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    data_dir = os.path.join(base, "data")
    _run(
        [
            os.path.join(bindir, "initdb"),
            "-D",
            data_dir,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]
    )
    port = free_port()
    options = " ".join(
        [
            f"-p {port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={base}",
            "-c fsync=off",
            "-c synchronous_commit=off",
            "-c full_page_writes=off",
            "-c max_connections=300",
            "-c shared_buffers=32MB",
        ]
    )
    _run(
        [
            os.path.join(bindir, "pg_ctl"),
            "-D",
            data_dir,
            "-l",
            os.path.join(base, "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        ]
    )
    return PostgresServer(host="127.0.0.1", port=port, user="postgres", data_dir=data_dir)


def _start_watchdog(server: PostgresServer, base: str) -> subprocess.Popen | None:
    """A detached shell that stops the server and removes ``base`` if this test process dies
    without cleaning up (SIGKILL, timeout), so no orphaned server is left running."""
    bindir = _find_bindir()
    if bindir is None:
        return None
    stop = subprocess.list2cmdline(
        _as_server_user(
            [os.path.join(bindir, "pg_ctl"), "-D", server.data_dir, "-m", "immediate", "stop"]
        )
    )
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 2; done; "
        f"{stop} >/dev/null 2>&1; rm -rf {subprocess.list2cmdline([base])}"
    )
    return subprocess.Popen(
        ["sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop_server(server: PostgresServer) -> None:
    bindir = _find_bindir()
    if bindir is None:
        return
    try:
        _run(
            [os.path.join(bindir, "pg_ctl"), "-D", server.data_dir, "-m", "immediate", "stop"],
            timeout=60,
        )
    except (RuntimeError, subprocess.SubprocessError):
        pass


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server on 127.0.0.1 for this test session."""
    base = tempfile.mkdtemp(prefix="ckptstore-pg-")
    try:
        server = _start_server(base)
        import psycopg

        with psycopg.connect(server.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - every cause becomes a skip/fail with its reason
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"PostgreSQL test server could not start: {type(exc).__name__}: {exc}")
    watchdog = _start_watchdog(server, base)
    try:
        yield server
    finally:
        _stop_server(server)
        shutil.rmtree(base, ignore_errors=True)
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()


@pytest.fixture
def postgres_url_factory(postgres_server: PostgresServer) -> Callable[[], str]:
    """``make() -> str``: a new empty database per call, as a ``postgresql://`` URL."""
    return postgres_server.create_database


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A registry URL: a SQLite file in ``tmp_path`` or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("postgres_url_factory")()
