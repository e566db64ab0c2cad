"""Retrying short registry transactions that lost a race with another writer.

Retried (bounded, exponential backoff with jitter): SQLite "database is locked/busy", PostgreSQL
serialization failures (40001), deadlocks (40P01), lock timeouts (55P03) and dropped
connections. Anything else propagates at once.

Example::

    from ckptstore.registry.retry import run_with_retry

    rows = run_with_retry(lambda: do_transaction(), what="record checkpoint")
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ATTEMPTS = 10
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0

_PG_RETRY_CODES = {"40001", "40P01", "55P03", "57P01", "08000", "08003", "08006"}
_SQLITE_RETRY_TEXT = ("database is locked", "database is busy", "database table is locked")


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` is a lost race or dropped connection worth retrying."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in _PG_RETRY_CODES:
        return True
    text = str(orig).lower()
    return any(fragment in text for fragment in _SQLITE_RETRY_TEXT)


def run_with_retry(
    func: Callable[[], T],
    *,
    what: str,
    attempts: int = MAX_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``func`` until it succeeds or fails with a non-transient error, at most
    ``attempts`` times. The last transient error is re-raised."""
    delay = FIRST_DELAY_S
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except sa_exc.DBAPIError as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            wait = min(MAX_DELAY_S, delay) * (0.5 + random.random())
            logger.debug(
                "Registry %s lost a race (%s); retry %d/%d in %.2fs",
                what,
                type(exc.orig).__name__,
                attempt,
                attempts - 1,
                wait,
            )
            sleep(wait)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover
