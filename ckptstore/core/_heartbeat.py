"""The trial heartbeat: while a ``core.init`` context is open, its chief records every
:data:`~ckptstore.registry.entities.HEARTBEAT_SECONDS` that the trial's process is alive, so a
trial left ACTIVE by a process that died without saying so (SIGKILL, a lost machine) shows as
LOST instead of "running" for ever.

Example::

    beat = Heartbeat(registry, trial_id=7)   # records one now, then every 30 s
    ...
    beat.close()
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptstore.registry import Registry

logger = logging.getLogger(__name__)

#: Seconds between heartbeats, for tests that need a short interval (default: the registry's).
HEARTBEAT_ENV = "CKPTSTORE_HEARTBEAT_SECONDS"


def _interval() -> float:
    from ckptstore.registry.entities import HEARTBEAT_SECONDS

    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    try:
        return max(0.1, float(raw)) if raw else HEARTBEAT_SECONDS
    except ValueError:
        logger.warning(
            "%s=%r is not a number of seconds; using %s", HEARTBEAT_ENV, raw, HEARTBEAT_SECONDS
        )
        return HEARTBEAT_SECONDS


class Heartbeat:
    """A daemon thread updating ``trials.heartbeat_at``; a failed write is logged and retried
    at the next beat (a registry hiccup must not stop training)."""

    def __init__(self, registry: Registry, trial_id: int) -> None:
        self._registry = registry
        self._trial_id = trial_id
        self._stop = threading.Event()
        self._interval = _interval()
        self._beat()  # the first one now: a page opened at once sees a live trial
        self._thread = threading.Thread(
            target=self._run, name=f"ckptstore-heartbeat-{trial_id}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        try:
            self._registry.trial_heartbeat(self._trial_id)
        except Exception as exc:  # noqa: BLE001 - logged; the next beat tries again
            logger.warning("Trial %d: heartbeat not recorded: %s", self._trial_id, exc)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._beat()

    def close(self) -> None:
        """Stop beating (before the registry is closed). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
