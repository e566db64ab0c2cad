"""Short transactions against the registry database, retried and with clean errors.

:class:`Database` owns the engine. ``write(fn)`` / ``read(fn)`` run ``fn(connection)`` in one
transaction (SQLite writes use ``BEGIN IMMEDIATE``), retry lost races (see
:mod:`ckptstore.registry.retry`) and turn driver errors into
:class:`~ckptstore.errors.RegistryError` with the password removed.

Example::

    from ckptstore.registry.db import Database

    db = Database("sqlite:///tmp/registry.db")
    count = db.read(lambda conn: conn.exec_driver_sql("SELECT 1").scalar(), what="ping")
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from ckptstore import errors
from ckptstore.registry.engine import WRITE_OPTION, make_engine, safe_url
from ckptstore.registry.migrations import migrate
from ckptstore.registry.retry import run_with_retry

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A registry call still waiting after this many seconds is logged, then every
#: ``SLOW_CALL_REPEAT_S``: behind a lock (another writer on the same SQLite file, a PostgreSQL
#: transaction) a call can wait for minutes, and a silent wait looks like a hang.
SLOW_CALL_LOG_S = 5.0
SLOW_CALL_REPEAT_S = 15.0


class _SlowCallWatcher:
    """One daemon thread per process watching every registry call in flight (a thread per
    call would be started at interpreter shutdown too, where Python 3.11 cannot start one
    and an open context's close would wait for it for ever)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[int, list[Any]] = {}  # token -> [start, next log, url, what]
        self._next = 0
        self._thread: threading.Thread | None = None

    def add(self, url: str, what: str) -> int:
        now = time.monotonic()
        with self._cond:
            self._next += 1
            self._calls[self._next] = [now, now + SLOW_CALL_LOG_S, url, what]
            if self._thread is None and not sys.is_finalizing():
                self._thread = threading.Thread(
                    target=self._run, name="ckptstore-registry-wait", daemon=True
                )
                self._thread.start()
            self._cond.notify()  # the watcher recomputes when it wakes next
            return self._next

    def remove(self, token: int) -> None:
        with self._cond:
            self._calls.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [c for c in self._calls.values() if c[1] <= now]
                for call in due:
                    call[1] = now + SLOW_CALL_REPEAT_S
                wake = min((c[1] for c in self._calls.values()), default=None)
                timeout = None if wake is None else max(0.05, wake - now)  # add() notifies
            for start, _, url, what in due:
                logger.warning(
                    "Still waiting (%.0f s) for registry %s to %s: another process holds a lock "
                    "on it (a writer on the same SQLite file, or an open PostgreSQL transaction), "
                    "or the server does not answer. ckptstore keeps retrying; stop the other "
                    "process or check the database.",
                    now - start,
                    url,
                    what,
                )
            with self._cond:
                self._cond.wait(timeout)


_WATCHER = _SlowCallWatcher()


def _new_watcher_in_child() -> None:
    # A forked child has no watcher thread, and its lock may have been held at the fork.
    global _WATCHER
    _WATCHER = _SlowCallWatcher()


os.register_at_fork(after_in_child=_new_watcher_in_child)


@contextlib.contextmanager
def log_if_slow(url: str, what: str) -> Iterator[None]:
    """Log a WARNING naming the registry and the operation while the block runs longer than
    :data:`SLOW_CALL_LOG_S` (repeated every :data:`SLOW_CALL_REPEAT_S`), from one watcher
    thread shared by every call."""
    token = _WATCHER.add(url, what)
    try:
        yield
    finally:
        _WATCHER.remove(token)


class Database:
    """A migrated registry database (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.url = safe_url(self.engine.url)
        # libpq also takes the password as ?password= (a query value, maybe a tuple of them).
        query_password = self.engine.url.query.get("password")
        self._passwords = [
            str(p)
            for p in (self.engine.url.password, *_as_tuple(query_password))
            if p  # an empty password would "replace" everywhere
        ]
        self._closed = False
        #: Run before each outermost call (add_barrier); per-thread call depth.
        self._barriers: list[Callable[[], None]] = []
        self._calls = threading.local()
        try:
            with log_if_slow(self.url, "open and migrate the registry"):
                self.version = migrate(self.engine)
        except errors.CkptstoreError:
            self.engine.dispose()
            raise
        except sa_exc.SQLAlchemyError as exc:
            self.engine.dispose()
            raise self._error("open and migrate the registry", exc) from None
        # A forked child must not reuse the parent's pooled connections (they share sockets
        # and SQLite file locks); it opens its own on first use.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _drop_inherited_pool(ref))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def insert(self, table: sa.Table) -> Any:
        """A dialect-specific INSERT that supports ``on_conflict_do_*``."""
        # Imported here: the PostgreSQL dialect alone costs ~0.15 s of a SQLite user's start.
        if self.dialect == "postgresql":
            from sqlalchemy.dialects import postgresql

            return postgresql.insert(table)
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(table)

    @staticmethod
    def inserted(conn: sa.Connection, stmt: Any) -> bool:
        """Run an ``INSERT ... ON CONFLICT DO NOTHING`` on a table with an ``id`` column; True
        if it inserted a row. (RETURNING, because psycopg reports no rowcount for it.)"""
        return conn.execute(stmt.returning(sa.literal_column("1"))).first() is not None

    def add_barrier(self, wait: Callable[[], None]) -> Callable[[], None]:
        """Run ``wait()`` before each outermost call and before close; returns its remover."""
        self._barriers.append(wait)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._barriers.remove(wait)

        return remove

    def write(self, fn: Callable[[sa.Connection], T], *, what: str) -> T:
        """Run ``fn`` in a write transaction, retrying lost races."""
        return self._run(fn, what=what, write=True)

    def read(self, fn: Callable[[sa.Connection], T], *, what: str) -> T:
        """Run ``fn`` in a read transaction, retrying lost races."""
        return self._run(fn, what=what, write=False)

    def _run(self, fn: Callable[[sa.Connection], T], *, what: str, write: bool) -> T:
        depth = getattr(self._calls, "depth", 0)
        if depth == 0:  # a nested call inside a transaction must not wait for another writer
            for barrier in tuple(self._barriers):
                barrier()
        self._calls.depth = depth + 1
        try:
            return self._run_once(fn, what=what, write=write)
        finally:
            self._calls.depth = depth

    def _run_once(self, fn: Callable[[sa.Connection], T], *, what: str, write: bool) -> T:
        if self._closed:
            raise errors.RegistryError(
                f"Registry {self.url} is closed; open a new Registry to {what}."
            )

        def attempt() -> T:
            conn = self.engine.connect()
            if write:
                conn = conn.execution_options(**{WRITE_OPTION: True})
            with conn, conn.begin():
                return fn(conn)

        try:
            with log_if_slow(self.url, what):
                return run_with_retry(attempt, what=what)
        except errors.CkptstoreError:
            raise
        except sa_exc.SQLAlchemyError as exc:
            # A value refused by a column type of ckptstore.registry.schema (before the
            # database saw it) comes wrapped in a StatementError: raise it as it is.
            if isinstance(getattr(exc, "orig", None), errors.CkptstoreError):
                raise exc.orig from None  # type: ignore[misc]
            raise self._error(what, exc) from None

    def bump_sequence(self, conn: sa.Connection, table: sa.Table) -> None:
        """After inserting explicit ids on PostgreSQL, move the id sequence past them so later
        auto-numbered rows do not collide. Never moves the sequence backwards."""
        if self.dialect != "postgresql":
            return
        seq = conn.execute(sa.select(sa.func.pg_get_serial_sequence(table.name, "id"))).scalar_one()
        if not seq:
            return
        conn.execute(
            sa.text(
                "SELECT setval(CAST(:seq AS regclass), GREATEST("
                f"(SELECT COALESCE(MAX(id), 1) FROM {table.name}), "
                f"(SELECT last_value FROM {seq})))"
            ),
            {"seq": seq},
        )

    def _error(self, what: str, exc: sa_exc.SQLAlchemyError) -> errors.RegistryError:
        orig = getattr(exc, "orig", None) or exc
        detail = str(orig).strip().splitlines()[0] if str(orig).strip() else ""
        for password in self._passwords:
            detail = detail.replace(password, "***")
        return errors.RegistryError(
            f"Registry {self.url} failed to {what}: {type(orig).__name__}: {detail}. "
            "Check that the database server is running and reachable, the URL, user and "
            "permissions are right, and (SQLite) the file is on a local, writable disk."
        )

    def close(self) -> None:
        for barrier in tuple(self._barriers):  # queued writes first, while the engine is open
            barrier()
        if not self._closed:
            self._closed = True
            self.engine.dispose()


def _as_tuple(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)


def _drop_inherited_pool(ref: weakref.ref[Database]) -> None:
    db = ref()
    if db is not None and not db._closed:
        db.engine.dispose(close=False)
