"""Bounded retries with exponential backoff and full jitter for transient storage failures.

Backends classify exceptions (transient or not) and translate them into
:mod:`ckptstore.errors` types; this module only decides when to try again.

Example::

    from ckptstore.storage_backends.retry import RetryPolicy
    policy = RetryPolicy(max_attempts=3)
    policy.call(lambda: fetch(), is_transient=lambda e: isinstance(e, TimeoutError),
                on_give_up=lambda e: RuntimeError(str(e)))
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ckptstore.errors import InvalidStorageConfig, StorageError

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a storage call is retried.

    Args:
        max_attempts: total tries of one call (1 = no retry). Default 5.
        base_delay: seconds before the first retry; doubles each time. Default 0.2.
        max_delay: cap on one backoff sleep, seconds. Default 8.
        timeout: per-request connect/read timeout in seconds given to the client library, so a
            stalled transfer fails (and is retried) instead of hanging. Default 60.
    """

    max_attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 8.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidStorageConfig(
                f"max_attempts must be an int >= 1. Received: max_attempts={self.max_attempts!r}"
            )
        for name in ("base_delay", "max_delay", "timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidStorageConfig(
                    f"{name} must be a positive number of seconds. Received: {name}={value!r}"
                )

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1-based): full jitter over an exponential cap."""
        cap = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return random.uniform(0, cap)

    def call(
        self,
        fn: Callable[[], T],
        *,
        is_transient: Callable[[BaseException], bool],
        translate: Callable[[BaseException, bool], StorageError],
        what: str = "storage call",
    ) -> T:
        """Run ``fn``; retry transient failures; raise ``translate(exc, exhausted)`` otherwise.

        ``translate`` receives the last exception and whether the retry budget was used up.
        Errors that are already :class:`~ckptstore.errors.StorageError` pass through unchanged.
        """
        attempt = 1
        while True:
            try:
                return fn()
            except StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                transient = is_transient(exc)
                if not transient or attempt >= self.max_attempts:
                    raise translate(exc, transient) from exc
                delay = self.backoff(attempt)
                logger.warning(
                    "%s failed (%s); retry %d/%d in %.2fs",
                    what,
                    type(exc).__name__,
                    attempt,
                    self.max_attempts - 1,
                    delay,
                )
                time.sleep(delay)
                attempt += 1
