"""Pins: protection from GC that other processes can see, kept as leases in the index.

``CheckpointContext.protect(uuid)`` and ``restore_path(uuid)`` must keep GC from deleting a
checkpoint, including GC running in another process or on another machine (``ckptstore gc``,
another trial's background GC). When the index implements
:class:`~ckptstore.checkpointing.index.PinningIndex` (the registry does), a :class:`PinKeeper`
pins each such checkpoint there under a holder name unique to this process
(``host:pid:random``), with a lease that a background thread renews while the pin is held.
Pins are released on :meth:`PinKeeper.close` (``CheckpointContext.close()``) and at
interpreter exit; the pins of a process that crashed expire with their lease.

Without a pinning index, protection stays in-process only: GC in another process does not
know about it. That is the limitation of storage-only mode (no registry).

Example::

    keeper = PinKeeper(registry, lease_seconds=600)
    keeper.acquire(uuid)      # pinned in the registry, renewed every lease/3
    keeper.release(uuid)      # unpinned when the last holder in this process releases it
    keeper.close()
"""

from __future__ import annotations

import atexit
import datetime as _dt
import logging
import os
import secrets
import socket
import threading
import weakref

from ckptstore import errors
from ckptstore.checkpointing.index import CheckpointIndex, supports_pins
from ckptstore.validators import number_at_least

logger = logging.getLogger(__name__)

#: How long a pin lasts without renewal: the longest a crashed process keeps protecting.
DEFAULT_PIN_LEASE_SECONDS = 600.0


def make_holder() -> str:
    """A holder name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class PinKeeper:
    """Reference-counted pins of one process in a pinning index (see the module docstring).

    Args:
        index: the index; pins are kept only if it implements
            :class:`~ckptstore.checkpointing.index.PinningIndex`, otherwise this only counts.
        lease_seconds: pin lifetime; renewed every third of it while held.
        holder: the holder name (default :func:`make_holder`).
    """

    def __init__(
        self,
        index: CheckpointIndex | None,
        *,
        lease_seconds: float = DEFAULT_PIN_LEASE_SECONDS,
        holder: str | None = None,
    ) -> None:
        self.lease_seconds = number_at_least("pin_lease_seconds", lease_seconds, 0, strict=True)
        self.index = index if supports_pins(index) else None
        self.holder = holder or make_holder()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()  # a forked child must not release its parent's pins
        if self.index is not None:
            ref = weakref.ref(self)
            self._atexit = lambda: _close_ref(ref)
            atexit.register(self._atexit)

    @property
    def shared(self) -> bool:
        """True when pins are visible to other processes (the index can hold them)."""
        return self.index is not None

    def held(self) -> set[str]:
        """UUIDs this process holds pins on."""
        with self._lock:
            return set(self._counts)

    def acquire(self, uuid: str) -> None:
        """Pin ``uuid`` (once more). The first acquire pins it in the index; an index error
        is raised and nothing is counted."""
        with self._lock:
            if self._closed:
                raise errors.CheckpointError("This CheckpointContext was closed; create a new one.")
            first = uuid not in self._counts
            if first and self.index is not None:
                self.index.pin_checkpoint(uuid, self.holder, self._expiry())
            self._counts[uuid] = self._counts.get(uuid, 0) + 1
            if first and self.index is not None:
                self._start_renewal()

    def release(self, uuid: str) -> None:
        """Undo one :meth:`acquire`; the last one unpins ``uuid`` in the index (an index
        error is logged: the pin then expires with its lease)."""
        with self._lock:
            count = self._counts.get(uuid, 0) - 1
            if count > 0:
                self._counts[uuid] = count
                return
            if self._counts.pop(uuid, None) is None:
                return
            if self.index is not None and not self._closed and os.getpid() == self._pid:
                self._unpin(uuid)

    def renew(self) -> None:
        """Extend every held pin by a full lease (the renewal thread calls this)."""
        with self._lock:
            uuids = list(self._counts) if not self._closed else []
            expires = self._expiry()
            for uuid in uuids:
                try:
                    self.index.pin_checkpoint(uuid, self.holder, expires)  # type: ignore[union-attr]
                except errors.CkptstoreError as exc:
                    logger.warning("Could not renew the GC pin on checkpoint %s: %s", uuid, exc)

    def close(self) -> None:
        """Release every pin and stop renewing. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            uuids = list(self._counts)
            self._counts.clear()
            if self.index is not None and os.getpid() == self._pid:
                for uuid in uuids:
                    self._unpin(uuid)
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self.index is not None:
            atexit.unregister(self._atexit)

    # ---- internals ---------------------------------------------------------------------------
    def _expiry(self) -> _dt.datetime:
        return _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=self.lease_seconds)

    def _unpin(self, uuid: str) -> None:
        try:
            self.index.unpin_checkpoint(uuid, self.holder)  # type: ignore[union-attr]
        except errors.CkptstoreError as exc:
            logger.warning(
                "Could not release the GC pin on checkpoint %s (it expires in at most %.0f s): %s",
                uuid,
                self.lease_seconds,
                exc,
            )

    def _start_renewal(self) -> None:
        if self._thread is not None:
            return
        ref = weakref.ref(self)
        interval = self.lease_seconds / 3
        stop = self._stop

        def loop() -> None:
            while not stop.wait(interval):
                keeper = ref()
                if keeper is None:
                    return
                try:
                    keeper.renew()
                except Exception as exc:  # noqa: BLE001 - keep renewing; pins expire if not
                    logger.warning("GC pin renewal failed: %s", exc)
                del keeper

        self._thread = threading.Thread(target=loop, name="ckptstore-pin-renewal", daemon=True)
        self._thread.start()


def _close_ref(ref: weakref.ref[PinKeeper]) -> None:
    keeper = ref()
    if keeper is not None:
        try:
            keeper.close()
        except Exception as exc:  # noqa: BLE001 - never fail interpreter exit
            logger.debug("Releasing GC pins at exit failed: %s", exc)
