"""The commit and delete protocols on storage, without any context or threads.

Commit: (remote) a pending marker -> the files -> ``metadata.json`` -> ``MANIFEST.json``
create-only, last -> marker removed. On a local file system a finished staging folder is
renamed into place instead of uploading. Full delete marks the index row DELETING, removes the
manifest, then the files, then marks the row DELETED: a delete cut short leaves an uncommitted
folder (ignored by readers, removed by GC) and a row no reader returns, never a checkpoint with
missing files; reconcile finishes it.

Example::

    from ckptstore.checkpointing import commit, format as ckpt_format
    metadata = ckpt_format.build_metadata(uuid, {"steps_completed": 10})
    record = commit.commit_dir(storage, uuid, "/tmp/ckpt", metadata)
"""

from __future__ import annotations

import glob as _glob
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.index import (
    DELETED,
    DELETING,
    PARTIALLY_DELETED,
    PENDING,
    CheckpointIndex,
    CheckpointRecord,
)

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


class PreparedFiles:
    """The user's files of one checkpoint folder and their manifest entries."""

    def __init__(self, local_dir: str, checksums: Mapping[str, str] | None = None) -> None:
        self.local_dir = local_dir
        self.files = fmt.local_files(local_dir)
        self.entries = fmt.manifest_entries(self.files, checksums)
        top = set(os.listdir(local_dir))
        #: True when the folder holds reserved names we must not upload (so upload by list).
        self.has_reserved = bool(top & fmt.RESERVED_NAMES)
        if self.has_reserved:
            # Uploading an explicit list loses empty-folder markers; keep the manifest honest.
            self.entries = {r: e for r, e in self.entries.items() if not r.endswith("/")}

    def upload_to(self, storage: Storage, uuid: str) -> dict[str, int]:
        """Upload these files to ``uuid/``."""
        if not self.entries:
            return {}
        paths = None if not self.has_reserved else list(self.entries)
        return storage.upload(self.local_dir, uuid, paths=paths)


def manifest_for(uuid: str, entries: Mapping[str, Any], metadata_bytes: bytes) -> dict[str, Any]:
    """A manifest of ``entries`` plus ``metadata.json`` (format 2 when an entry has blobs)."""
    files = dict(entries)
    files[fmt.METADATA_NAME] = {
        "size": len(metadata_bytes),
        "crc32c": fmt.crc32c_bytes(metadata_bytes),
    }
    dedup = any("blobs" in e for e in entries.values())
    return {
        "format_version": fmt.BLOBS_FORMAT_VERSION if dedup else fmt.FORMAT_VERSION,
        "uuid": uuid,
        "files": dict(sorted(files.items())),
    }


def write_pending_marker(storage: Storage, uuid: str, blob_refs: Iterable[str] = ()) -> None:
    """Date the start of an upload so GC can tell a stale leftover from a live upload; a
    deduplicated upload also names the blobs it will reference (the blob sweep keeps them)."""
    info: dict[str, Any] = {
        "started_at": time.time(),
        "host": os.uname().nodename,
        "pid": os.getpid(),
    }
    refs = sorted(set(blob_refs))
    if refs:
        info["blobs"] = refs
    storage.write_bytes(f"{uuid}/{fmt.PENDING_MARKER_NAME}", fmt.dump_json(info))


def remove_pending_marker(storage: Storage, uuid: str) -> None:
    try:
        storage.delete(f"{uuid}/{fmt.PENDING_MARKER_NAME}")
    except errors.StorageError as exc:  # harmless: the manifest already committed it
        logger.warning("Could not remove the pending marker of %s: %s", uuid, exc)


def write_manifest(storage: Storage, uuid: str, manifest: Mapping[str, Any]) -> None:
    """Write ``MANIFEST.json`` create-only: the commit point.

    A retried create whose first try did reach the server (only the answer was lost) finds
    the manifest already there; if it holds exactly our bytes, the commit is ours.
    """
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    data = fmt.manifest_bytes(manifest)
    if not storage.write_if_absent(key, data):
        try:
            if storage.read_bytes(key) == data:
                logger.debug("Manifest of %s already written by a retried request.", uuid)
                return
        except errors.StorageNotFound:
            pass
        raise errors.CheckpointConflict(
            f"Checkpoint {uuid} in {storage.url} already has a manifest: another writer "
            "committed the same UUID. Save again to get a new UUID."
        )


def record_pending(
    index: CheckpointIndex | None, uuid: str, metadata: Mapping[str, Any], storage_url: str
) -> None:
    if index is None:
        return
    record = fmt.record_from({"uuid": uuid, "files": {}}, metadata, storage_url)
    record.state = PENDING
    index.record_checkpoint(record)


def record_committed(
    index: CheckpointIndex | None,
    manifest: Mapping[str, Any],
    metadata: Mapping[str, Any],
    storage_url: str,
) -> CheckpointRecord:
    record = fmt.record_from(manifest, metadata, storage_url)
    if index is not None:
        index.record_checkpoint(record)
    return record


def commit_dir(
    storage: Storage,
    uuid: str,
    local_dir: str,
    metadata: Mapping[str, Any],
    *,
    owned: bool = False,
    index: CheckpointIndex | None = None,
    storage_url: str | None = None,
    checksums: Mapping[str, str] | None = None,
    dedup_chunk_bytes: int | None = None,
    cuts: Mapping[str, Iterable[int]] | None = None,
    known_blobs: blobs.KnownBlobs | None = None,
) -> CheckpointRecord:
    """Commit the files of ``local_dir`` as checkpoint ``uuid`` with ``metadata``.

    With ``dedup_chunk_bytes`` the files are stored as content-addressed chunks of that size
    (:mod:`~ckptstore.checkpointing.blobs`, format 2): chunks already in storage are not
    uploaded again.

    With ``owned`` the folder belongs to ckptstore: on a local file system it is renamed into
    place (no copy), otherwise it is removed after the upload. ``checksums`` (``{relpath:
    crc32c}``) spares reading again files whose writer computed their crc32c. ``cuts``
    (``{relpath: [offset, ...]}``, deduplicated commits only) says where a file's content
    pieces (tensors) begin and end, so chunks are cut there; ``known_blobs`` is the writer's
    belief of which blobs are in storage (:class:`~ckptstore.checkpointing.blobs.KnownBlobs`,
    updated after the commit).
    """
    url = storage_url or storage.url
    prepared = PreparedFiles(local_dir, checksums)
    if dedup_chunk_bytes is not None and not prepared.has_reserved:
        return _commit_dedup(
            storage,
            uuid,
            prepared,
            metadata,
            owned,
            index,
            url,
            dedup_chunk_bytes,
            cuts=cuts,
            known_blobs=known_blobs,
        )
    meta_bytes = fmt.dump_json(metadata)
    manifest = manifest_for(uuid, prepared.entries, meta_bytes)
    record_pending(index, uuid, metadata, url)
    renamed = False
    if owned and not prepared.has_reserved and storage.local_path(uuid) is not None:
        with open(os.path.join(local_dir, fmt.METADATA_NAME), "wb") as f:
            f.write(meta_bytes)
        renamed = storage.rename_dir_into(local_dir, uuid)
        if not renamed:
            os.unlink(os.path.join(local_dir, fmt.METADATA_NAME))
    if not renamed:
        write_pending_marker(storage, uuid)
        prepared.upload_to(storage, uuid)
        storage.write_bytes(f"{uuid}/{fmt.METADATA_NAME}", meta_bytes)
        # GC (another process, or a grace period shorter than this upload) may have removed
        # the folder as a stale leftover: then its files are gone, and a manifest would
        # commit a checkpoint that cannot be read.
        _check_marker_kept(storage, uuid)
    write_manifest(storage, uuid, manifest)
    if not renamed:
        remove_pending_marker(storage, uuid)
        if owned:
            shutil.rmtree(local_dir, ignore_errors=True)
    logger.info(
        "Committed checkpoint %s (%d files) to %s", uuid, len(manifest["files"]), storage.url
    )
    return record_committed(index, manifest, metadata, url)


def _commit_dedup(
    storage: Storage,
    uuid: str,
    prepared: PreparedFiles,
    metadata: Mapping[str, Any],
    owned: bool,
    index: CheckpointIndex | None,
    url: str,
    chunk_bytes: int,
    *,
    cuts: Mapping[str, Iterable[int]] | None = None,
    known_blobs: blobs.KnownBlobs | None = None,
) -> CheckpointRecord:
    """The deduplicated commit: marker naming every blob -> missing blobs (create-only) ->
    ``metadata.json`` -> running sweeps waited for -> reused blobs checked again -> manifest
    (the commit) -> marker gone (the protocol: :mod:`~ckptstore.checkpointing.blobs`)."""
    entries = blobs.plan(prepared.local_dir, prepared.entries, chunk_bytes, cuts)
    meta_bytes = fmt.dump_json(metadata)
    manifest = manifest_for(uuid, entries, meta_bytes)
    record_pending(index, uuid, metadata, url)
    write_pending_marker(storage, uuid, blobs.referenced(manifest))
    known = known_blobs.get() if known_blobs is not None else None
    stats = blobs.upload(storage, prepared.local_dir, entries, chunk_bytes, known=known)
    # Empty folders ("dir/" entries) live only in the manifest: readers recreate them.
    storage.write_bytes(f"{uuid}/{fmt.METADATA_NAME}", meta_bytes)
    # A sweep running now may have read the references before our marker existed: let it
    # end, then put back any reused blob it removed. Only then commit, so a kill at any
    # point after the manifest leaves every blob it names in place.
    blobs.wait_for_sweeps(storage)
    _check_marker_kept(storage, uuid)
    blobs.recheck(storage, prepared.local_dir, stats)
    write_manifest(storage, uuid, manifest)
    remove_pending_marker(storage, uuid)
    if known_blobs is not None:
        known_blobs.set(blobs.referenced(manifest))
    if owned:
        shutil.rmtree(prepared.local_dir, ignore_errors=True)
    logger.info(
        "Committed checkpoint %s (%d files, %d bytes uploaded, %d bytes already stored) to %s",
        uuid,
        len(manifest["files"]),
        stats.uploaded,
        stats.reused,
        storage.url,
    )
    return record_committed(index, manifest, metadata, url)


def _check_marker_kept(storage: Storage, uuid: str) -> None:
    """Our pending marker protects the files and blobs we uploaded; GC removes it (with the
    folder) only from an upload older than its grace period. Then the folder's files, and the
    blobs a sweep may have taken, are gone: commit nothing."""
    if not storage.file_exists(f"{uuid}/{fmt.PENDING_MARKER_NAME}"):
        raise errors.CheckpointError(
            f"The upload of checkpoint {uuid} to {storage.url} outlived GC's grace period: GC "
            "removed it as a stale leftover, so nothing was committed. Save again, and set "
            "gc_grace_seconds above the longest upload."
        )


# ---- deletes -----------------------------------------------------------------------------------
def delete_checkpoint(storage: Storage, uuid: str, index: CheckpointIndex | None = None) -> None:
    """Delete the whole checkpoint, in an order that never leaves the index pointing at
    nothing: the index row goes to DELETING first (an index that cannot be written stops the
    delete before any file goes), then the manifest (uncommit), then the files, then the row
    is finished (DELETED). A delete cut short between the steps is finished by
    :func:`~ckptstore.checkpointing.reconcile.reconcile` (run by GC and at start-up)."""
    fmt.check_storage_id(uuid)
    if index is not None:
        try:
            index.set_checkpoint_state(uuid, DELETING)
        except errors.CheckpointNotFound:
            index = None  # not in the index: storage is all there is to delete
    remove_files(storage, uuid)
    if index is not None:
        index.set_checkpoint_state(uuid, DELETED, resources={})
    logger.info("Deleted checkpoint %s from %s", uuid, storage.url)


def remove_files(storage: Storage, uuid: str) -> None:
    """Remove checkpoint ``uuid`` from storage: the manifest first (so a removal cut short
    leaves an uncommitted folder, never a checkpoint with missing files), then the rest.
    Idempotent."""
    storage.delete(f"{uuid}/{fmt.MANIFEST_NAME}")
    storage.delete(uuid)


def delete_files(
    storage: Storage,
    uuid: str,
    globs: Iterable[str],
    index: CheckpointIndex | None = None,
) -> str:
    """Delete the files of checkpoint ``uuid`` matching ``globs``; returns the new state.

    The manifest is rewritten (listing what remains, marked partially deleted) *before* the
    files go, so it never lists a file that is missing. ``metadata.json`` is always kept; when
    no other file remains the whole checkpoint is deleted (state DELETED).
    """
    globs = [globs] if isinstance(globs, str) else list(globs)
    select = fmt.compile_selector(globs)
    manifest = fmt.read_manifest(storage, uuid)
    files = manifest["files"]
    doomed = [r for r in files if r != fmt.METADATA_NAME and select(r)]
    if not doomed:
        logger.info("delete(%s, globs=%s): nothing matched.", uuid, globs)
        return PARTIALLY_DELETED if manifest.get("partially_deleted") else "COMMITTED"
    remaining = {r: e for r, e in files.items() if r not in doomed}
    if not set(remaining) - {fmt.METADATA_NAME}:
        delete_checkpoint(storage, uuid, index)
        return DELETED
    new_manifest = dict(manifest, files=remaining, partially_deleted=True)
    if index is not None:
        # The row first: it then lists only files that stay (an index that cannot be written
        # stops the delete before anything changes in storage).
        try:
            index.set_checkpoint_state(
                uuid, PARTIALLY_DELETED, resources={r: e["size"] for r, e in remaining.items()}
            )
        except errors.CheckpointNotFound:
            pass  # not in the index
    storage.write_bytes(f"{uuid}/{fmt.MANIFEST_NAME}", fmt.manifest_bytes(new_manifest))
    storage.delete(uuid, globs=[_glob.escape(r) for r in doomed])
    logger.info("Deleted %d files of checkpoint %s (globs=%s)", len(doomed), uuid, globs)
    return PARTIALLY_DELETED


# ---- leftovers ---------------------------------------------------------------------------------
def leftover_started_at(storage: Storage, name: str) -> float | None:
    """When an uncommitted folder was started (epoch seconds), or None if unknown.

    Uses the pending marker, else ``metadata.json``'s ``created_at``, else (local file systems)
    the newest modification time inside the folder.
    """
    try:
        info = json.loads(storage.read_bytes(f"{name}/{fmt.PENDING_MARKER_NAME}"))
        if isinstance(info.get("started_at"), (int, float)):
            return float(info["started_at"])
    except (errors.StorageNotFound, ValueError, AttributeError):
        pass
    try:
        meta = json.loads(storage.read_bytes(f"{name}/{fmt.METADATA_NAME}"))
        created = fmt.parse_created_at(meta.get("created_at"))
        if created is not None:
            return created.timestamp()
    except (errors.StorageNotFound, ValueError, AttributeError):
        pass
    path = storage.local_path(name)
    if path is not None and os.path.isdir(path):
        newest = os.path.getmtime(path)
        for root, dirs, files in os.walk(path):
            for entry in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, entry)).st_mtime)
                except FileNotFoundError:
                    continue
        return newest
    return None
