"""Garbage collection: apply a retention policy to a trial's checkpoints and remove
uncommitted leftovers.

GC is idempotent and tolerant: files already gone are fine, a failure on one checkpoint is
logged and the others are still processed. It never deletes a protected checkpoint (registered
as a model version, pinned, or the one the current run resumed from) nor an upload in flight;
with an index, protection is read again just before each delete, so a pin taken by another
process while GC runs is honoured.

With an index, GC first reconciles the index's PENDING rows with storage
(:mod:`ckptstore.checkpointing.reconcile`), so a checkpoint committed by a process killed
before it updated the index is subject to retention like any other. It also removes stray
``.ckptstore-pending.json`` markers that such a kill leaves inside committed checkpoints
(never a file the manifest lists). Finally it removes content-addressed blobs
(:mod:`~ckptstore.checkpointing.blobs`) that no committed manifest and no pending marker names.

Example::

    from ckptstore.checkpointing.collector import collect
    from ckptstore.checkpointing.retention import LatestN

    deleted = collect(storage, policy=LatestN(2), trial_id=7)
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid as _uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ckptstore import errors
from ckptstore.checkpointing import blob_gc, commit, condemned, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.condemned import StorageClock
from ckptstore.checkpointing.index import (
    DELETED,
    CheckpointIndex,
    CheckpointRecord,
    searcher_metric_of,
)
from ckptstore.checkpointing.reconcile import (
    DEFAULT_GRACE_SECONDS,
    InFlight,
    ReconcileReport,
    has_leftovers,
    in_flight_now,
    reconcile,
    same_storage,
)
from ckptstore.checkpointing.retention import GCContext, GCPolicy
from ckptstore.storage_backends.object_store import TMP_MARK

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def _candidates(
    storage: Storage,
    index: CheckpointIndex | None,
    trial_id: int | None,
    experiment_id: int | None,
    storage_url: str,
    reconciled: ReconcileReport | None = None,
) -> tuple[list[CheckpointRecord], list[CheckpointRecord]]:
    """(the trial's committed checkpoints, the experiment's), oldest first."""
    if index is not None:
        trial = index.checkpoint_records(trial_id=trial_id)
        if trial_id is None:
            trial = [r for r in trial if r.trial_id is None]
        experiment = (
            index.checkpoint_records(experiment_id=experiment_id)
            if experiment_id is not None
            else []
        )
        if reconciled is not None:  # a dry run did not write them to the index
            found = list(reconciled.committed.values())
            trial = _merge(trial, [r for r in found if r.trial_id == trial_id])
            if experiment_id is not None:
                experiment = _merge(
                    experiment, [r for r in found if r.experiment_id == experiment_id]
                )
    else:
        scanned = scan.scan_checkpoints(storage, storage_url)
        trial = [r for r in scanned if r.trial_id == trial_id]
        experiment = (
            [r for r in scanned if r.experiment_id == experiment_id]
            if experiment_id is not None
            else []
        )
    trial = scan.sort_records(r for r in trial if same_storage(r, storage_url))
    return trial, scan.sort_records(experiment)


def _merge(rows: list[CheckpointRecord], extra: list[CheckpointRecord]) -> list[CheckpointRecord]:
    known = {r.uuid for r in rows}
    return rows + [r for r in extra if r.uuid not in known]


def collect(
    storage: Storage,
    *,
    policy: GCPolicy | None,
    index: CheckpointIndex | None = None,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    protected: Iterable[str] = (),
    in_flight: InFlight = (),
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    storage_url: str | None = None,
    dry_run: bool = False,
    reconcile_scope: str = "trial",
) -> list[str]:
    """Delete the trial's checkpoints ``policy`` does not keep, then uncommitted leftovers
    older than ``grace_seconds``. Returns the deleted (or, with ``dry_run``, deletable) names.

    ``policy=None`` keeps every committed checkpoint (only leftovers are removed). With an
    index, PENDING rows are first reconciled with storage: those of the trial
    (``reconcile_scope="trial"``), of every trial (``"all"``), or none (``"none"``).
    """
    if reconcile_scope not in ("trial", "all", "none"):
        raise errors.InvalidConfig(
            "reconcile_scope must be 'trial', 'all' or 'none'. Received: "
            f"reconcile_scope={reconcile_scope!r}"
        )
    url = storage_url or storage.url
    in_flight_set = in_flight_now(in_flight)
    keep = set(protected) | in_flight_set()
    reconciled: ReconcileReport | None = None
    if index is not None and reconcile_scope != "none":
        reconciled = reconcile(
            storage,
            index,
            trial_id=trial_id,
            all_trials=reconcile_scope == "all",
            grace_seconds=grace_seconds,
            storage_url=url,
            skip=in_flight_set,
            dry_run=dry_run,
        )
    if index is not None:
        keep |= set(index.protected_checkpoint_uuids())
    doomed: list[str] = []
    if policy is not None:
        trial, experiment = _candidates(
            storage, index, trial_id, experiment_id, url, reconciled if dry_run else None
        )
        searcher = (
            searcher_metric_of(index, trial_id=trial_id, experiment_id=experiment_id)
            if index is not None
            else None
        )
        context = GCContext(
            experiment_checkpoints=experiment,
            searcher_metric=searcher[0] if searcher else None,
            searcher_smaller_is_better=searcher[1] if searcher else True,
        )
        flags = policy.should_preserve(trial, context=context)
        doomed = [
            r.uuid for r, flag in zip(trial, flags, strict=True) if not flag and r.uuid not in keep
        ]
    deleted: list[str] = []
    for uuid in doomed:
        if dry_run:
            deleted.append(uuid)
            continue
        try:
            if index is not None and uuid in index.protected_checkpoint_uuids():
                logger.info("GC keeps checkpoint %s: it was pinned while GC ran.", uuid)
                continue
            commit.delete_checkpoint(storage, uuid, index)
            deleted.append(uuid)
        except errors.CkptstoreError as exc:
            logger.warning("GC could not delete checkpoint %s: %s", uuid, exc)
    deleted += _collect_leftovers(storage, index, keep, in_flight_set, grace_seconds, dry_run)
    # Blobs last: only once the deletes above removed their manifests is a blob unreferenced.
    try:
        blob_gc.sweep(storage, dry_run=dry_run)
    except errors.CkptstoreError as exc:
        logger.warning("GC could not sweep unreferenced blobs: %s", exc)
    if reconciled is not None and reconciled.leftovers and not dry_run:
        _forget_removed(storage, index, reconciled.leftovers)
    if deleted:
        logger.info("GC %s %s in %s", "would delete" if dry_run else "deleted", deleted, url)
    return deleted


def _is_uuid(name: str) -> bool:
    try:
        return str(_uuid.UUID(name)) == name.lower()
    except ValueError:
        return False


def _collect_leftovers(
    storage: Storage,
    index: CheckpointIndex | None,
    keep: set[str],
    in_flight: Callable[[], set[str]],
    grace_seconds: float,
    dry_run: bool,
) -> list[str]:
    """Remove uncommitted folders ckptstore provably wrote (they hold its pending marker, or
    are its local staging folders) whose marker is older than ``grace_seconds`` by the
    storage's clock. A UUID-named folder without a marker is someone else's (Determined's
    checkpoints have no manifest): it is never touched."""
    clock: StorageClock | None = None

    def storage_clock() -> StorageClock:
        nonlocal clock
        if clock is None:
            clock = StorageClock.probe(storage)
            if not dry_run:
                older = min(grace_seconds, condemned.DEBRIS_SECONDS)
                condemned.clean_probes(storage, clock, older)
        return clock

    removed = []
    for name in storage.list_children(""):
        if name == condemned.CLOCK_DIR:
            storage_clock()  # cleans the probes killed processes left
            continue
        uuid = name[len(fmt.STAGING_PREFIX) :] if name.startswith(fmt.STAGING_PREFIX) else name
        if not _is_uuid(uuid):
            continue
        # Asked now, before the manifest check: an upload of this process that made this
        # folder is in flight until its manifest exists (see reconcile.in_flight_now).
        if uuid in keep or uuid in in_flight():
            continue
        try:
            slot = _commit_slot(storage, name) if name == uuid else None
            if slot == "removed":  # a removal cut short (or done): finish it, keep the fence
                if not dry_run and set(storage.list(name)) != {fmt.MANIFEST_NAME}:
                    commit.remove_marked_folder(storage, name)
                continue
            if slot == "committed":
                # committed (or a damaged manifest: left for a human to look at)
                marker = f"{uuid}/{fmt.PENDING_MARKER_NAME}"
                if not dry_run and storage.file_exists(marker):
                    remove_stray_marker(storage, uuid, storage_clock().stamp, grace_seconds)
                continue
            stamp = commit.leftover_stamp(storage, name)
            now = storage_clock().stamp
            if stamp is None:
                if not dry_run and _remove_debris(storage, name, now, grace_seconds):
                    removed.append(name)  # a kill between mkdir and the marker's write
                else:
                    logger.debug("GC leaves %s alone: it holds no ckptstore marker.", name)
                continue
            if now - stamp < grace_seconds:
                continue
            if not dry_run and not _remove_leftover(storage, index, name, uuid):
                continue
            removed.append(name)
        except errors.CkptstoreError as exc:
            logger.warning("GC could not remove the uncommitted folder %s: %s", name, exc)
    return removed


def _remove_debris(storage: Storage, name: str, now: float, grace: float) -> bool:
    """Remove a local folder that holds nothing but ckptstore's temporary files, all older
    than a minute (or the grace period, if shorter): a kill between creating the folder and
    the marker's rename."""
    path = storage.local_path(name)
    if path is None or not os.path.isdir(path):
        return False
    for root, _dirs, files in os.walk(path):
        for file in files:
            full = os.path.join(root, file)
            if TMP_MARK not in file or now - os.lstat(full).st_mtime < min(
                grace, condemned.DEBRIS_SECONDS
            ):
                return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


def _commit_slot(storage: Storage, name: str) -> str:
    """``"committed"`` (a manifest, valid or not), ``"removed"`` (the tombstone) or
    ``"empty"``: what the commit slot of folder ``name`` holds."""
    try:
        data = storage.read_bytes(f"{name}/{fmt.MANIFEST_NAME}")
    except errors.StorageNotFound:
        return "empty"
    return "removed" if data == fmt.TOMBSTONE_MANIFEST else "committed"


def _remove_leftover(storage: Storage, index: CheckpointIndex | None, name: str, uuid: str) -> bool:
    """The marker becomes a tombstone first, so a writer that checks it afterwards commits
    nothing; then the commit slot is fenced, create-only, with the tombstone manifest
    (:func:`~ckptstore.checkpointing.commit.fence_uncommitted`): a writer that committed in
    time wins and the folder is kept, and a writer paused for any length of time before its
    manifest write finds the slot taken when it wakes up (CheckpointConflict), so it never
    commits a folder whose files and blobs GC removes below. A staging folder has no slot
    (its writer renames it into ``<uuid>`` or fails)."""
    storage.write_bytes(f"{name}/{fmt.PENDING_MARKER_NAME}", commit.TOMBSTONE)
    if name == uuid and not commit.fence_uncommitted(storage, name):
        return False
    commit.remove_marked_folder(storage, name)
    if index is not None and name == uuid:
        try:
            index.set_checkpoint_state(uuid, DELETED, resources={})
        except errors.CkptstoreError:
            pass  # not in the index: nothing to update
    return True


def remove_stray_marker(
    storage: Storage, uuid: str, now: float | None = None, grace_seconds: float = 0.0
) -> bool:
    """Remove the pending marker a kill right after the commit can leave inside committed
    checkpoint ``uuid``, once it is older than ``grace_seconds`` at storage time ``now``
    (a younger one may be an amend in progress, whose new blobs it protects). Readers ignore
    it (the manifest does not list it); a marker the manifest does list is a user file and is
    kept. True if one was removed."""
    key = f"{uuid}/{fmt.PENDING_MARKER_NAME}"
    stamp = commit.leftover_stamp(storage, uuid)
    if stamp is None or (now is not None and now - stamp < grace_seconds):
        return False
    manifest = fmt.load_manifest(storage, uuid)
    if fmt.PENDING_MARKER_NAME in manifest.files:
        return False
    storage.delete(key)
    logger.info("GC removed a stray pending marker from committed checkpoint %s", uuid)
    return True


def _forget_removed(storage: Storage, index: CheckpointIndex, uuids: Iterable[str]) -> None:
    """Mark DELETED the stale PENDING rows whose uncommitted leftovers GC just removed."""
    for uuid in uuids:
        try:
            if has_leftovers(storage, uuid):
                continue  # not removed (younger by its marker, or protected)
            index.set_checkpoint_state(uuid, DELETED, resources={})
        except errors.CkptstoreError as exc:
            logger.warning("GC could not mark checkpoint %s DELETED: %s", uuid, exc)
