"""The delete, protection and garbage-collection side of a
:class:`~ckptstore.checkpointing.context.CheckpointContext`.

:class:`Collecting` holds what a context keeps from GC (checkpoints pinned with
:meth:`~Collecting.protect`, in use by ``restore_path``, being committed) and when it
collects: now (:meth:`~Collecting.gc`) or once in the background after a commit, coalesced.
The collection itself is :func:`~ckptstore.checkpointing.collector.collect`; the state it
reads is set up by ``CheckpointContext.__init__``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ckptstore.checkpointing import commit
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.collector import collect
from ckptstore.checkpointing.distributed import ProcessGroup
from ckptstore.checkpointing.index import CheckpointIndex
from ckptstore.checkpointing.pins import PinKeeper
from ckptstore.checkpointing.reconcile import ReconcileReport, reconcile
from ckptstore.checkpointing.retention import GCPolicy
from ckptstore.storage_backends import Storage

logger = logging.getLogger("ckptstore.checkpointing.context")


class Collecting:
    """Delete, protect, reconcile and garbage-collect: the methods of
    :class:`~ckptstore.checkpointing.context.CheckpointContext` that decide what storage
    keeps."""

    storage: Storage
    storage_url: str
    index: CheckpointIndex | None
    trial_id: int | None
    experiment_id: int | None
    distributed: ProcessGroup
    gc_policy: GCPolicy | None
    gc_grace_seconds: float
    _pins: PinKeeper
    _protected: set[str]
    _in_use: dict[str, int]
    _protected_lock: threading.Lock
    _gc_executor: ThreadPoolExecutor
    _gc_lock: threading.Lock
    _gc_flag_lock: threading.Lock
    _gc_future: Future[list[str]] | None
    _gc_queued: bool
    _closed: bool
    if TYPE_CHECKING:  # defined by CheckpointContext
        _check_open: Callable[[], None]
        _manifest: Callable[[str], fmt.Manifest]
        _in_flight: Callable[[], list[str]]

    def delete(self, storage_id: str, globs: Iterable[str] | None = None) -> None:
        """Delete checkpoint ``storage_id``, or only its files matching ``globs`` (it is then
        PARTIALLY_DELETED, with a manifest listing what remains). A whole delete leaves its
        tombstone ``<id>/MANIFEST.json`` (28 bytes) for good: reading the id then raises
        CheckpointDeleted, and a writer stopped mid-commit can never recommit it."""
        self._check_open()
        fmt.check_storage_id(storage_id)
        if globs is None:
            commit.delete_checkpoint(self.storage, storage_id, self.index)
            return
        self._manifest(storage_id)
        commit.delete_files(self.storage, storage_id, globs, self.index)

    def protect(self, uuid: str) -> None:
        """Never let GC delete ``uuid`` (e.g. the checkpoint this run resumed from) while this
        context is open.

        With an index that supports pins (the registry), ``uuid`` is pinned there under this
        process's holder name (``host:pid:random``) with a lease renewed in the background,
        so GC in any process using the same registry keeps it; the pin is released by
        :meth:`close` or at interpreter exit, and expires after ``pin_lease_seconds`` if the
        process dies. Without such an index the protection is known only in this process:
        GC run elsewhere (``ckptstore gc``, another trial) on storage alone cannot see it.
        """
        fmt.check_storage_id(uuid)
        with self._protected_lock:
            if uuid in self._protected:
                return
            self._pins.acquire(uuid)
            self._protected.add(uuid)

    @property
    def protected(self) -> frozenset[str]:
        """UUIDs pinned with :meth:`protect`."""
        with self._protected_lock:
            return frozenset(self._protected)

    @property
    def pin_holder(self) -> str:
        """The holder name of this context's index pins (``host:pid:random``)."""
        return self._pins.holder

    def reconcile(self, all_trials: bool = False, dry_run: bool = False) -> ReconcileReport:
        """Make the index's PENDING rows of this trial (of every trial with ``all_trials``)
        agree with storage, the source of truth: committed in storage -> COMMITTED (from the
        manifest and metadata); no manifest, older than ``gc_grace_seconds`` and nothing left
        in storage -> DELETED. Uploads in flight here are left alone. Without an index there
        is nothing to reconcile. See :mod:`ckptstore.checkpointing.reconcile`."""
        self._check_open()
        if self.index is None:
            return ReconcileReport()
        return reconcile(
            self.storage,
            self.index,
            trial_id=self.trial_id,
            all_trials=all_trials,
            grace_seconds=self.gc_grace_seconds,
            storage_url=self.storage_url,
            skip=self._in_flight,
            dry_run=dry_run,
        )

    def gc(self, dry_run: bool = False) -> list[str]:
        """Apply the GC policy now and remove stale uncommitted folders; returns what was
        deleted (or would be, with ``dry_run``). With an index, every trial's PENDING rows
        are reconciled first (:meth:`reconcile`), and stray pending markers are removed from
        committed checkpoints."""
        self._check_open()
        with self._gc_lock:
            return self._collect(dry_run, reconcile_scope="all")

    def _collect(self, dry_run: bool = False, reconcile_scope: str = "trial") -> list[str]:
        return collect(
            self.storage,
            policy=self.gc_policy,
            index=self.index,
            trial_id=self.trial_id,
            experiment_id=self.experiment_id,
            protected=self._protected_now(),
            in_flight=self._in_flight,
            grace_seconds=self.gc_grace_seconds,
            storage_url=self.storage_url,
            dry_run=dry_run,
            reconcile_scope=reconcile_scope,
        )

    def _protected_now(self) -> set[str]:
        with self._protected_lock:
            return self._protected | set(self._in_use)

    def _after_commit(self) -> None:
        """Queue one background GC run (coalesced) after a commit, on the chief."""
        if self.gc_policy is None or self.distributed.rank != 0 or self._closed:
            return
        with self._gc_flag_lock:
            if self._gc_queued:
                return
            self._gc_queued = True

        def run() -> list[str]:
            with self._gc_flag_lock:
                self._gc_queued = False
            with self._gc_lock:
                try:
                    return self._collect()
                except Exception as exc:  # GC must never break training
                    logger.warning("Background GC failed: %s", exc)
                    return []

        self._gc_future = self._gc_executor.submit(run)

    def _use(self, storage_id: str, delta: int) -> None:
        with self._protected_lock:
            count = self._in_use.get(storage_id, 0) + delta
            if delta > 0:
                self._pins.acquire(storage_id)  # raises (index down) before counting it
            if count:
                self._in_use[storage_id] = count
            else:
                self._in_use.pop(storage_id, None)
            if delta < 0:
                self._pins.release(storage_id)
