"""Reconciliation: make the index's PENDING rows agree with storage, the source of truth.

A checkpoint is recorded PENDING in the index before its upload and COMMITTED after its
manifest is written. A process killed between the two leaves a checkpoint that storage holds
committed but the index still calls PENDING: the registry's ``latest_checkpoint`` misses it and
GC never applies retention to it. A process killed before its manifest leaves a PENDING row
for a checkpoint that will never exist.

:func:`reconcile` looks at PENDING rows (of one trial, or all) that belong to this storage:

- manifest in storage -> the row is rewritten from the manifest and ``metadata.json``
  (:func:`ckptstore.checkpointing.scan.record_from`), COMMITTED or PARTIALLY_DELETED;
- no manifest, older than the grace period, nothing left in storage -> DELETED;
- no manifest, older than the grace period, an uncommitted folder still in storage -> left
  PENDING and reported in ``leftovers``: GC removes the folder (and marks the row DELETED);
- younger than the grace period -> left alone (the upload may still be running).

It also rolls forward deletes cut short: a DELETING row (see
:func:`ckptstore.checkpointing.commit.delete_checkpoint`) has its files removed (manifest first;
idempotent) and is marked DELETED.

Rows of another storage URL are never touched. It is idempotent and cheap when nothing is
PENDING (one index query).

Example::

    from ckptstore.checkpointing.reconcile import reconcile

    report = reconcile(storage, registry, trial_id=7, grace_seconds=3600)
    print(report.committed, report.deleted)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import commit, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.index import (
    DELETED,
    DELETING,
    LIVE_STATES,
    PENDING,
    CheckpointIndex,
    CheckpointRecord,
)

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: Uploads in flight in this process: UUIDs, or a callable giving them as they are now.
InFlight = Iterable[str] | Callable[[], Iterable[str]]


def in_flight_now(in_flight: InFlight) -> Callable[[], set[str]]:
    """A callable giving the uploads in flight now. An upload registers itself before it
    writes anything, so asking again just before acting on a folder or row that was listed
    finds every upload of this process that could have made it (a snapshot taken earlier
    misses those started since)."""
    if callable(in_flight):
        get = in_flight
        return lambda: set(get())
    fixed = set(in_flight)
    return lambda: fixed


#: Uncommitted folders (and PENDING rows) younger than this are left alone: they may be
#: uploads in progress.
DEFAULT_GRACE_SECONDS = 3600.0


@dataclasses.dataclass
class ReconcileReport:
    """What :func:`reconcile` did (or, with ``dry_run``, would do)."""

    #: PENDING rows found committed in storage, now COMMITTED/PARTIALLY_DELETED, by UUID.
    committed: dict[str, CheckpointRecord] = dataclasses.field(default_factory=dict)
    #: Stale PENDING rows with nothing left in storage, now DELETED.
    deleted: list[str] = dataclasses.field(default_factory=list)
    #: Stale PENDING rows whose uncommitted folder is still in storage (GC removes it).
    leftovers: list[str] = dataclasses.field(default_factory=list)
    #: DELETING rows (deletes cut short) whose delete was finished: files removed, DELETED.
    finished_deletes: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.committed or self.deleted or self.finished_deletes)


def same_storage(record: CheckpointRecord, storage_url: str) -> bool:
    """True if ``record`` belongs to the storage at ``storage_url`` (no URL: assumed yes)."""
    return not record.storage_url or record.storage_url == storage_url


def pending_records(
    index: CheckpointIndex,
    *,
    trial_id: int | None,
    all_trials: bool,
    storage_url: str,
    state: str = PENDING,
) -> list[CheckpointRecord]:
    """The index's rows in ``state`` (PENDING) of ``trial_id`` (or of every trial) in this
    storage."""
    if all_trials:
        rows = index.checkpoint_records(states=(state,))
    else:
        rows = index.checkpoint_records(trial_id=trial_id, states=(state,))
        if trial_id is None:  # the index filters nothing for None: keep trial-less rows
            rows = [r for r in rows if r.trial_id is None]
    return [r for r in rows if same_storage(r, storage_url)]


def reconcile(
    storage: Storage,
    index: CheckpointIndex,
    *,
    trial_id: int | None = None,
    all_trials: bool = False,
    grace_seconds: float,
    storage_url: str | None = None,
    skip: InFlight = (),
    dry_run: bool = False,
) -> ReconcileReport:
    """Bring the PENDING rows of ``trial_id`` (every trial with ``all_trials``) in line with
    storage; see the module docstring. ``skip`` names UUIDs to leave alone (uploads in flight
    in this process; a callable is asked again for each row). Errors on one row are logged
    and the others are still processed."""
    url = storage_url or storage.url
    report = ReconcileReport()
    in_flight = in_flight_now(skip)
    rows = pending_records(index, trial_id=trial_id, all_trials=all_trials, storage_url=url)
    now = _dt.datetime.now(_dt.timezone.utc)
    for row in rows:
        if row.uuid in in_flight() or not fmt.is_checkpoint_name(row.uuid):
            continue
        try:
            _reconcile_one(storage, index, row, url, now, grace_seconds, dry_run, report)
        except errors.CkptstoreError as exc:
            logger.warning("Could not reconcile PENDING checkpoint %s: %s", row.uuid, exc)
    deleting = pending_records(
        index, trial_id=trial_id, all_trials=all_trials, storage_url=url, state=DELETING
    )
    for row in deleting:
        if row.uuid in in_flight() or not fmt.is_checkpoint_name(row.uuid):
            continue
        try:
            if not dry_run:
                commit.remove_files(storage, row.uuid)
                index.set_checkpoint_state(row.uuid, DELETED, resources={})
            report.finished_deletes.append(row.uuid)
        except errors.CkptstoreError as exc:
            logger.warning("Could not finish the delete of checkpoint %s: %s", row.uuid, exc)
    if report.finished_deletes:
        logger.info(
            "%s %d delete(s) cut short in %s: %s",
            "Would finish (dry run)" if dry_run else "Finished",
            len(report.finished_deletes),
            url,
            report.finished_deletes,
        )
    if report.committed or report.deleted or report.leftovers:
        logger.info(
            "Reconciled %s with %s: %d PENDING -> committed %s, %d -> DELETED %s, %d left for GC",
            "(dry run)" if dry_run else "the index",
            url,
            len(report.committed),
            sorted(report.committed),
            len(report.deleted),
            report.deleted,
            len(report.leftovers),
        )
    return report


def reconcile_trial(
    storage: Storage | str | Mapping[str, Any],
    index: CheckpointIndex,
    trial_id: int | None,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> ReconcileReport:
    """:func:`reconcile` one trial's PENDING rows, with ``storage`` given as a
    :class:`~ckptstore.storage_backends.Storage`, a URL or a config dict (opened and closed
    here). For callers that look up a trial's latest checkpoint in the index before they
    create a ``CheckpointContext``."""
    from ckptstore.storage_backends import Storage, open_storage

    owned = not isinstance(storage, Storage)
    store = open_storage(storage)
    try:
        return reconcile(store, index, trial_id=trial_id, grace_seconds=grace_seconds)
    finally:
        if owned:
            store.close()


def _reconcile_one(
    storage: Storage,
    index: CheckpointIndex,
    row: CheckpointRecord,
    url: str,
    now: _dt.datetime,
    grace_seconds: float,
    dry_run: bool,
    report: ReconcileReport,
) -> None:
    uuid = row.uuid
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    try:
        data: bytes | None = storage.read_bytes(key)
    except errors.StorageNotFound:
        data = None
    if data == fmt.TOMBSTONE_MANIFEST:
        data = None  # deleted (GC fenced its commit slot): no checkpoint
    if data is not None:
        record = _record(storage, uuid, data, row.storage_url or url)
        if record is None:
            return
        if not dry_run:
            index.record_checkpoint(record)
            record = _confirm(storage, index, uuid, data, record, row.storage_url or url)
            if record is None:
                return
        report.committed[uuid] = record
        return
    created = row.created_at
    if created is None:
        return  # cannot tell its age: leave it
    if created.tzinfo is None:
        created = created.replace(tzinfo=_dt.timezone.utc)
    if (now - created).total_seconds() < grace_seconds:
        return
    if has_leftovers(storage, uuid):
        report.leftovers.append(uuid)
        return
    if not dry_run:
        index.set_checkpoint_state(uuid, DELETED, resources={})
    report.deleted.append(uuid)


def _record(storage: Storage, uuid: str, data: bytes, url: str) -> CheckpointRecord | None:
    """The record a committed checkpoint's manifest bytes and metadata describe, or None
    (logged) when either is damaged: a human should look at it, we do not guess."""
    try:
        manifest = fmt.Manifest.parse(data, uuid)
        metadata = ckpt_metadata.read_metadata(storage, uuid)
    except errors.InvalidCheckpoint as exc:
        logger.warning("PENDING checkpoint %s has a damaged commit; left PENDING: %s", uuid, exc)
        return None
    metadata.setdefault("uuid", uuid)
    return scan.record_from(manifest, metadata, url)


def _confirm(
    storage: Storage,
    index: CheckpointIndex,
    uuid: str,
    data: bytes,
    record: CheckpointRecord,
    url: str,
) -> CheckpointRecord | None:
    """Read the manifest again after writing the row: a GC in another process may have
    deleted (or partially deleted) the checkpoint between our read and our write, and our
    write must not resurrect it in the index."""
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    try:
        again = storage.read_bytes(key)
        if again == fmt.TOMBSTONE_MANIFEST:
            raise errors.StorageNotFound(key)
    except errors.StorageNotFound:
        index.set_checkpoint_state(uuid, DELETED, resources={})
        logger.info("Checkpoint %s was deleted while being reconciled; marked DELETED.", uuid)
        return None
    if again == data:
        return record
    newer = _record(storage, uuid, again, url)
    if newer is not None:
        index.record_checkpoint(newer)
    return newer


def has_leftovers(storage: Storage, uuid: str) -> bool:
    """True if storage still holds anything of uncommitted checkpoint ``uuid`` (its folder,
    or on a local file system its staging folder)."""
    if storage.exists(uuid) and not fmt.is_removed(storage, uuid):
        return True
    if storage.local_path(uuid) is not None:
        return bool(storage.exists(fmt.STAGING_PREFIX + uuid))
    return False


def newest_in_storage(
    storage: Storage,
    records: Iterable[CheckpointRecord],
    *,
    storage_url: str | None = None,
    trial_id: int | None = None,
) -> CheckpointRecord | None:
    """The first of ``records`` (in the caller's order of preference, e.g. newest first)
    whose manifest is in storage; records of another storage URL are taken as they are (they
    cannot be checked here). A record whose manifest is gone is skipped with a warning saying
    why, so a caller never resumes from or loads a checkpoint that no longer exists."""
    url = storage_url or storage.url
    for record in records:
        if record.state not in LIVE_STATES or not same_storage(record, url):
            return record
        if fmt.holds_commit(storage, record.uuid):
            return record
        logger.warning(
            "Skipping checkpoint %s%s: the index calls it %s but %s has no manifest for it "
            "(deleted outside ckptstore, or a delete was cut short); taking the next newest. "
            "`ckptstore reindex` repairs the index.",
            record.uuid,
            f" of trial {trial_id}" if trial_id is not None else "",
            record.state,
            url,
        )
    return None
