"""What a storage holds: the committed checkpoints under its prefix (:func:`list_committed`)
and their :class:`~ckptstore.checkpointing.index.CheckpointRecord` rows, built the same way
at commit time and by a rescan (:func:`record_from`, :func:`scan_checkpoints`), in one order
(:func:`sort_records`). ``Registry.reindex``, reconcile and the registry-less readers use it.

Example::

    from ckptstore.checkpointing import scan
    from ckptstore.storage_backends import open_storage

    storage = open_storage("/tmp/ckpts")
    for record in scan.scan_checkpoints(storage):
        print(record.uuid, record.steps_completed)
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.format import (
    MANIFEST_NAME,
    TOMBSTONE_MANIFEST,
    Manifest,
    is_checkpoint_name,
)
from ckptstore.checkpointing.index import COMMITTED, PARTIALLY_DELETED, CheckpointRecord
from ckptstore.checkpointing.metadata import parse_created_at, read_metadata

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def _checkpoint_children(storage: Storage) -> list[str]:
    return [name for name in storage.list_children("") if is_checkpoint_name(name)]


def _try_manifest(
    storage: Storage, uuid: str, skipped: dict[str, str] | None = None
) -> Manifest | None:
    try:
        data = storage.read_bytes(f"{uuid}/{MANIFEST_NAME}")
    except errors.StorageNotFound:
        logger.debug("Ignoring %s in %s: no manifest (not committed).", uuid, storage.url)
        return None
    if data == TOMBSTONE_MANIFEST:
        return None  # deleted: its commit slot is fenced
    try:
        return Manifest.parse(data, uuid)
    except errors.InvalidCheckpoint as exc:
        logger.warning("Ignoring %s in %s: not a checkpoint. %s", uuid, storage.url, exc)
        if skipped is not None:
            skipped[uuid] = str(exc)
        return None


def list_committed(storage: Storage) -> list[str]:
    """UUIDs of the committed checkpoints under the storage prefix, sorted by name. Folders
    without a valid manifest are skipped (a warning for a malformed one)."""
    return [u for u in _checkpoint_children(storage) if _try_manifest(storage, u) is not None]


def record_from(
    manifest: Manifest, metadata: Mapping[str, Any], storage_url: str
) -> CheckpointRecord:
    """The :class:`CheckpointRecord` that a manifest and metadata describe. Used both when a
    checkpoint is committed and by :func:`scan_checkpoints`, so a reindex reproduces it."""
    metrics = metadata.get("metrics")
    return CheckpointRecord(
        uuid=str(metadata.get("uuid") or manifest.uuid),
        trial_id=metadata.get("trial_id"),
        experiment_id=metadata.get("experiment_id"),
        steps_completed=int(metadata.get("steps_completed") or 0),
        continue_id=metadata.get("continue_id"),
        state=PARTIALLY_DELETED if manifest.partially_deleted else COMMITTED,
        metadata=dict(metadata),
        metrics=dict(metrics) if isinstance(metrics, dict) else {},
        resources=manifest.sizes(),
        storage_url=storage_url,
        created_at=parse_created_at(metadata.get("created_at")),
    )


def scan_checkpoints(
    storage: Storage, storage_url: str | None = None, *, skipped: dict[str, str] | None = None
) -> list[CheckpointRecord]:
    """Records (COMMITTED or PARTIALLY_DELETED) of every committed checkpoint in storage,
    oldest first by (steps_completed, created_at). Used by ``Registry.reindex``. A folder
    with a damaged manifest or metadata is left out, logged, and added to ``skipped``
    (``{uuid: why}``) when given."""
    records = []
    for uuid in _checkpoint_children(storage):
        manifest = _try_manifest(storage, uuid, skipped)
        if manifest is None:
            continue
        try:
            metadata = read_metadata(storage, uuid)
        except errors.InvalidCheckpoint as exc:
            logger.warning("Ignoring %s in %s: %s", uuid, storage.url, exc)
            if skipped is not None:
                skipped[uuid] = str(exc)
            continue
        metadata.setdefault("uuid", uuid)
        records.append(record_from(manifest, metadata, storage_url or storage.url))
    return sort_records(records)


def sort_records(records: Iterable[CheckpointRecord]) -> list[CheckpointRecord]:
    """Oldest first by (steps_completed, created_at, uuid)."""
    epoch = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    return sorted(records, key=lambda r: (r.steps_completed or 0, r.created_at or epoch, r.uuid))
