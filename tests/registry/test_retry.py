"""Lost races are retried (bounded), other errors are not; a real SQLite lock is waited out."""

from __future__ import annotations

import sqlite3
import threading

import psycopg
import pytest
from sqlalchemy import exc as sa_exc

from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.registry import Registry, engine, retry


def _wrapped(orig: BaseException) -> sa_exc.OperationalError:
    return sa_exc.OperationalError("INSERT ...", {}, orig)


@pytest.mark.parametrize(
    "orig",
    [
        sqlite3.OperationalError("database is locked"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
    ],
    ids=["sqlite-locked", "pg-serialization", "pg-deadlock"],
)
def test_transient_errors_are_retried(orig):
    assert retry.is_transient(_wrapped(orig))
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise _wrapped(orig)
        return "done"

    assert retry.run_with_retry(flaky, what="test", sleep=sleeps.append) == "done"
    assert len(calls) == 3 and len(sleeps) == 2 and sleeps[0] > 0


def test_retries_are_bounded():
    calls = []

    def always_locked():
        calls.append(1)
        raise _wrapped(sqlite3.OperationalError("database is locked"))

    with pytest.raises(sa_exc.OperationalError):
        retry.run_with_retry(always_locked, what="test", attempts=4, sleep=lambda s: None)
    assert len(calls) == 4


def test_other_errors_are_not_retried():
    calls = []

    def broken():
        calls.append(1)
        raise _wrapped(sqlite3.OperationalError("no such table: trials"))

    assert not retry.is_transient(_wrapped(sqlite3.OperationalError("no such table: trials")))
    with pytest.raises(sa_exc.OperationalError):
        retry.run_with_retry(broken, what="test", sleep=lambda s: None)
    assert len(calls) == 1
    assert not retry.is_transient(ValueError("x"))


def test_write_waits_out_a_real_sqlite_lock(tmp_path, monkeypatch):
    # A tiny busy timeout makes the first attempt fail with "database is locked"; the retry
    # loop must then succeed once the other writer lets go.
    monkeypatch.setattr(engine, "SQLITE_BUSY_TIMEOUT_S", 0.05)
    path = tmp_path / "r.db"
    with Registry(str(path)) as registry:
        blocker = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        locked = threading.Event()
        attempts = []
        real = retry.is_transient

        def spy(exc):
            result = real(exc)
            if result:
                attempts.append(exc)
                locked.set()
            return result

        monkeypatch.setattr(retry, "is_transient", spy)
        release = threading.Thread(target=lambda: (locked.wait(30), blocker.execute("COMMIT")))
        release.start()
        registry.record_checkpoint(CheckpointRecord(uuid="u", trial_id=1, state="COMMITTED"))
        release.join()
        blocker.close()
        assert attempts, "the write never hit the lock"
        assert registry.get_checkpoint("u").state == "COMMITTED"


def test_a_wait_on_a_locked_registry_is_logged(tmp_path, monkeypatch, caplog):
    """Issue 15 item 5: a registry locked by another process made core.init wait ~75 s without
    a log line. Now a wait longer than SLOW_CALL_LOG_S names the registry and the operation."""
    import logging
    import sqlite3
    import threading

    from ckptstore.registry import Registry, db

    path = tmp_path / "r.db"
    Registry(f"sqlite:///{path}").close()
    monkeypatch.setattr(db, "SLOW_CALL_LOG_S", 0.3)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's write lock
    threading.Timer(1.5, other.rollback).start()
    with caplog.at_level(logging.WARNING, logger="ckptstore"), Registry(f"sqlite:///{path}") as r:
        r.ensure_trial(1)
    other.close()
    assert "Still waiting" in caplog.text and "ensure a trial" in caplog.text
    assert str(path) in caplog.text
