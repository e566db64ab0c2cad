"""Turning a registry URL into a configured SQLAlchemy engine.

Accepted forms:

- ``sqlite:///relative/or/absolute/path.db`` or a plain filesystem path (becomes SQLite);
  parent folders are created. ``sqlite://`` / ``sqlite:///:memory:`` is an in-memory database.
- ``postgresql://``, ``postgres://`` (mapped to the psycopg 3 driver ``postgresql+psycopg://``)
  or any explicit ``postgresql+driver://`` URL.

SQLite connections run in WAL mode with a 30 s busy timeout and foreign keys on. Write
transactions on SQLite start with ``BEGIN IMMEDIATE`` so concurrent writers queue on the busy
timeout instead of failing on a lock upgrade.

Example::

    from ckptstore.registry.engine import make_engine, safe_url

    engine = make_engine("postgres://me:secret@db/ckpts")
    print(safe_url(engine.url))   # postgresql+psycopg://me:***@db/ckpts
"""

from __future__ import annotations

import logging
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import StaticPool

from ckptstore import errors
from ckptstore.masking import mask_text

logger = logging.getLogger(__name__)

#: Seconds a SQLite connection waits for another writer before giving up.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: Execution option that makes a SQLite transaction start with ``BEGIN IMMEDIATE``.
WRITE_OPTION = "ckptstore_write"


def safe_url(url: URL | str) -> str:
    """The URL as a string with any password replaced by ``***``: the user-info one and
    libpq's query form ``?password=`` (:func:`ckptstore.masking.mask_text`)."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except Exception:  # noqa: BLE001 - unparsable: show nothing that could be a secret
            return "<unparsable registry URL>"
    return mask_text(url.render_as_string(hide_password=True))


def normalize_url(url: str) -> URL:
    """Parse ``url`` into a SQLAlchemy URL, mapping plain paths to SQLite and ``postgres://`` /
    ``postgresql://`` to the psycopg 3 driver. Raises :class:`~ckptstore.errors.RegistryError`
    for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise errors.RegistryError(
            f"Registry URL must be a non-empty string. Received: {url!r}. Pass e.g. "
            "'sqlite:///path/registry.db', a file path, or 'postgresql://user@host/db'."
        )
    url = url.strip()
    if "://" not in url:  # a plain filesystem path
        return URL.create("sqlite", database=os.path.abspath(os.path.expanduser(url)))
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001
        raise errors.RegistryError(
            f"Registry URL {safe_url(url)} could not be parsed ({type(exc).__name__}). "
            "Use 'sqlite:///path/registry.db' or 'postgresql://user:password@host:port/db'."
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgres", "postgresql"):
        return parsed.set(drivername=f"postgresql+{driver or 'psycopg'}")
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            parsed = parsed.set(database=os.path.abspath(os.path.expanduser(parsed.database)))
        return parsed
    raise errors.RegistryError(
        f"Registry URL {safe_url(parsed)} uses the unsupported database {backend!r}. "
        "Use 'sqlite:///path/registry.db' (default) or 'postgresql://user@host/db'."
    )


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str) -> Engine:
    """A configured engine for ``url`` (see the module docstring)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    return _postgres_engine(parsed)


def _postgres_engine(url: URL) -> Engine:
    if url.get_driver_name() == "psycopg":
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise errors.MissingDependency(
                "The PostgreSQL registry needs psycopg 3. Install it with "
                "`pip install 'ckptstore[postgres]'` (or `pip install 'psycopg[binary]'`)."
            ) from None
    connect_args: dict[str, Any] = {"connect_timeout": 15}
    return sa.create_engine(
        url,
        connect_args=connect_args,
        pool_pre_ping=True,
        pool_size=2,
        max_overflow=8,
        hide_parameters=True,
    )


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    memory = database in ("", ":memory:")
    if not memory:
        parent = os.path.dirname(database)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise errors.RegistryError(
                f"Cannot create the folder {parent!r} for the SQLite registry ({exc.strerror}). "
                "Choose a writable location with CKPTSTORE_REGISTRY or Registry(url=...)."
            ) from None
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        "hide_parameters": True,
    }
    if memory:
        kwargs["poolclass"] = StaticPool
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (see "begin" below).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if not memory:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine
