"""Who runs which trial when several runners work on one search: runner identities and the
heartbeat that keeps a runner's trial leases (see :mod:`ckptstore.registry.leases`).

Every runner (``ckptstore experiment create/resume`` process) has an owner name
``host:pid:start:token``. It claims a trial in the registry before starting the trial's process
and a :class:`LeaseKeeper` thread renews the leases it holds every ``lease/10`` seconds. A
runner that dies stops renewing: after ``lease`` seconds (default 60, or
``CKPTSTORE_TRIAL_LEASE_SECONDS``) any runner may take its trials over, and a runner on the same
host takes them at once when the owner's process is gone (:func:`owner_is_dead_here`, which
also notices a reused pid by the process start time).

Example::

    keeper = LeaseKeeper(registry, runner_identity(), lease_seconds_from_env())
    keeper.start()
    if registry.claim_trial(7, keeper.owner, keeper.lease_seconds):
        keeper.add(7)
    ...
    keeper.stop()
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from ckptstore import errors

logger = logging.getLogger(__name__)

#: Environment variable overriding how long a trial lease lasts without renewal (seconds).
LEASE_SECONDS_ENV = "CKPTSTORE_TRIAL_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 60.0


def lease_seconds_from_env() -> float:
    """The lease length: ``CKPTSTORE_TRIAL_LEASE_SECONDS`` or 60 s."""
    raw = os.environ.get(LEASE_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise errors.InvalidConfig(
            f"{LEASE_SECONDS_ENV} must be a positive number of seconds (e.g. 60). Received: {raw!r}"
        )
    return value


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards), None where
    the process is gone or /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    """The process start time (clock ticks since boot) from /proc, None where unknown."""
    fields = _stat_fields(pid)
    # fields[0] is the state (field 3); the start time is field 22
    return fields[19] if fields is not None and len(fields) > 19 else None


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def runner_identity() -> str:
    """``host:pid:start:token``, unique to this runner (a new token per call)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or 0}:{uuid.uuid4().hex[:8]}"


def owner_is_dead_here(owner: str) -> bool:
    """True if ``owner`` names a runner on this host whose process is gone (or a zombie, or
    its pid now belongs to a later process). False for other hosts and unknown formats."""
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    if _state(pid) == "Z":
        return True
    started = _start_time(pid)
    return started is not None and parts[2] != "0" and started != parts[2]


class LeaseKeeper:
    """A daemon thread renewing this runner's trial leases until :meth:`stop`.

    Args:
        registry: the :class:`~ckptstore.registry.Registry` holding the leases.
        owner: this runner's :func:`runner_identity`.
        lease_seconds: how long a lease lasts without renewal.

    Trials whose lease was lost (another runner claimed it after it expired, e.g. while this
    runner could not reach the database) show up in :meth:`lost`; their processes must stop.
    """

    def __init__(self, registry: Any, owner: str, lease_seconds: float) -> None:
        self.registry = registry
        self.owner = owner
        self.lease_seconds = float(lease_seconds)
        self.interval = min(10.0, max(0.2, self.lease_seconds / 10))
        self._held: set[int] = set()
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trial-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, trial_id: int) -> None:
        """Keep renewing ``trial_id`` (already claimed by :attr:`owner`)."""
        with self._lock:
            self._held.add(trial_id)
            self._lost.discard(trial_id)

    def release(self, trial_id: int) -> None:
        """Stop renewing ``trial_id`` and release it in the registry."""
        with self._lock:
            self._held.discard(trial_id)
            lost = trial_id in self._lost
            self._lost.discard(trial_id)
        if lost:
            return
        try:
            self.registry.release_trial(trial_id, self.owner)
        except errors.CkptstoreError as exc:
            logger.warning("Could not release the lease on trial %d (%s)", trial_id, exc)

    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)

    def lost(self) -> set[int]:
        """Trials held before whose lease another runner has taken."""
        with self._lock:
            return set(self._lost)

    def renew_all(self) -> None:
        for trial_id in sorted(self.held()):
            try:
                ok = self.registry.renew_trial_lease(trial_id, self.owner, self.lease_seconds)
            except errors.CkptstoreError as exc:
                logger.warning("Could not renew the lease on trial %d (%s)", trial_id, exc)
                continue
            if not ok:
                with self._lock:
                    lost = trial_id in self._held  # else released meanwhile: not lost
                    if lost:
                        self._held.discard(trial_id)
                        self._lost.add(trial_id)
                if lost:
                    logger.error(
                        "Lost the lease on trial %d to another runner; stopping it here", trial_id
                    )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.renew_all()

    def stop(self) -> None:
        """Stop renewing and release every lease still held."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for trial_id in sorted(self.held()):
            self.release(trial_id)


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "LEASE_SECONDS_ENV",
    "LeaseKeeper",
    "lease_seconds_from_env",
    "owner_is_dead_here",
    "runner_identity",
]
