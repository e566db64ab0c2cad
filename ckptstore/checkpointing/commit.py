"""The commit and delete protocols on storage, without any context or threads.

Commit: (remote) a pending marker -> the files -> ``metadata.json`` -> ``MANIFEST.json``
create-only, last -> marker removed. On a local file system a finished staging folder is
renamed into place instead of uploading. Full delete marks the index row DELETING, removes the
manifest, then the files, then marks the row DELETED: a delete cut short leaves an uncommitted
folder (ignored by readers, removed by GC) and a row no reader returns, never a checkpoint with
missing files; reconcile finishes it.

Example::

    from ckptstore.checkpointing import commit, metadata as ckpt_metadata
    metadata = ckpt_metadata.build_metadata(uuid, {"steps_completed": 10})
    record = commit.commit_dir(storage, uuid, "/tmp/ckpt", metadata)
"""

from __future__ import annotations

import glob as _glob
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs, condemned, scan, signing
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.clock import elapsed_clock
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
    """The user's files of one checkpoint folder and their manifest entries (and, with
    ``sha256=True``, their SHA-256 for a signature, from the same read as their crc32c)."""

    def __init__(
        self, local_dir: str, checksums: Mapping[str, str] | None = None, *, sha256: bool = False
    ) -> None:
        self.local_dir = local_dir
        # A file written as its chunks (blobs.SplitFile) is read only from its parts; one
        # without a known crc32c is joined first, so the checksum reads its bytes.
        split = blobs.split_files(local_dir)
        blobs.materialize(local_dir, [rel for rel in split if rel not in (checksums or {})])
        parts = blobs.PARTS_DIR + "/"
        self.files = {
            rel: path
            for rel, path in fmt.local_files(local_dir).items()
            if not rel.startswith(parts)
        }
        #: ``{relpath: SHA-256}`` of every file (``sha256=True``), else empty.
        self.sha256: dict[str, str] = {}
        self.entries = fmt.manifest_entries(
            self.files, checksums, sha256=self.sha256 if sha256 else None
        )
        top = set(os.listdir(local_dir))
        #: True when the folder holds reserved names we must not upload (so upload by list).
        self.has_reserved = bool(top & fmt.RESERVED_NAMES)
        if self.has_reserved:
            # Uploading an explicit list loses empty-folder markers; keep the manifest honest.
            self.entries = {r: e for r, e in self.entries.items() if not r.endswith("/")}

    def sign(self, private_key: signing.KeyPath, name: str) -> None:
        """Sign the files' digests (``sha256=True``) and add the signature file to them."""
        out = os.path.join(self.local_dir, signing.SIGNATURE_NAME)
        covered = {rel: self.sha256[rel] for rel in signing.signed_names(self.sha256)}
        signing.sign_digests(covered, private_key, out, name=name)
        self.files[signing.SIGNATURE_NAME] = out
        self.entries.update(fmt.manifest_entries({signing.SIGNATURE_NAME: out}))

    def upload_to(self, storage: Storage, uuid: str) -> dict[str, int]:
        """Upload these files to ``uuid/``."""
        if not self.entries:
            return {}
        paths = None if not self.has_reserved else list(self.entries)
        return storage.upload(self.local_dir, uuid, paths=paths)


def _marker_bytes(blob_refs: Iterable[str] = ()) -> bytes:
    info: dict[str, Any] = {"host": os.uname().nodename, "pid": os.getpid()}
    refs = sorted(set(blob_refs))
    if refs:
        info["blobs"] = refs
    return fmt.dump_json(info)


def write_pending_marker(storage: Storage, uuid: str, blob_refs: Iterable[str] = ()) -> None:
    """Mark an upload in flight; GC dates it by the marker's storage timestamp. A
    deduplicated upload also names the blobs it will reference (GC keeps them)."""
    storage.write_bytes(f"{uuid}/{fmt.PENDING_MARKER_NAME}", _marker_bytes(blob_refs))


#: An upload refreshes its pending marker this often (the storage stamps each refresh).
HEARTBEAT_SECONDS = 30.0
#: GC removes an uncommitted folder only once its marker has not been refreshed for its grace
#: period; a writer commits only if its marker's refreshes never stopped for longer than this.
#: Together: GC with a grace of at least ``SAFE_GRACE_SECONDS`` never removes a folder whose
#: writer then commits (a refresh lands before the grace runs out, and the manifest before
#: any GC could decide, whatever the machines' clocks say).
LIVE_SECONDS = 300.0
SAFE_GRACE_SECONDS = LIVE_SECONDS + condemned.REQUEST_BUDGET_SECONDS


class PendingMarker:
    """The pending marker of one upload, refreshed every :data:`HEARTBEAT_SECONDS` on a
    thread while the upload runs.

    Example::

        with PendingMarker(storage, uuid, blob_refs) as marker:
            ...                      # upload
            marker.check_live()      # raise rather than commit a folder GC may have taken
            write_manifest(storage, uuid, manifest)
    """

    def __init__(self, storage: Storage, uuid: str, blob_refs: Iterable[str] = ()) -> None:
        self.storage = storage
        self.key = f"{uuid}/{fmt.PENDING_MARKER_NAME}"
        self.uuid = uuid
        self._data = _marker_bytes(blob_refs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Monotonic start of the last refresh that found the marker in place.
        self.refreshed = 0.0
        self._gap = 0.0
        self._lost = False

    def __enter__(self) -> PendingMarker:
        self.refreshed = condemned._monotonic()
        self.storage.write_bytes(self.key, self._data)
        self._thread = threading.Thread(
            target=self._beat, name=f"ckptstore-marker-{self.uuid[:8]}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            started = condemned._monotonic()
            try:
                if not self._still_ours():
                    self._lost = True  # GC is taking the folder: never write the marker again
                    return
                self.storage.write_bytes(self.key, self._data)
            except errors.StorageError as exc:
                logger.debug("Could not refresh the pending marker of %s: %s", self.uuid, exc)
                continue
            self._gap = max(self._gap, started - self.refreshed)
            self.refreshed = started

    def _still_ours(self) -> bool:
        try:
            return self.storage.read_bytes(self.key) == self._data
        except errors.StorageNotFound:
            return False

    def check_live(self) -> None:
        """Raise unless the marker is in place and was refreshed without a gap GC could use
        (then the folder and the blobs it names are all there)."""
        now = condemned._monotonic()
        gap = max(self._gap, now - self.refreshed)
        if self._lost or gap > LIVE_SECONDS or not self._still_ours():
            raise errors.CheckpointError(
                f"The upload of checkpoint {self.uuid} to {self.storage.url} lost its pending "
                f"marker or stalled for {gap:.0f} s: GC may have removed it as a leftover older "
                "than its grace period, so nothing was committed. Save again."
            )


def remove_pending_marker(storage: Storage, uuid: str) -> None:
    try:
        storage.delete(f"{uuid}/{fmt.PENDING_MARKER_NAME}")
    except errors.StorageError as exc:  # harmless: the manifest already committed it
        logger.warning("Could not remove the pending marker of %s: %s", uuid, exc)


def write_manifest(storage: Storage, uuid: str, manifest: fmt.Manifest | Mapping[str, Any]) -> None:
    """Write ``MANIFEST.json`` create-only: the commit point.

    A retried create whose first try did reach the server (only the answer was lost) finds
    the manifest already there; if it holds exactly our bytes, the commit is ours.
    """
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    data = fmt.manifest_bytes(manifest)
    if not storage.write_if_absent(key, data):
        try:
            there = storage.read_bytes(key)
            if there == data:
                logger.debug("Manifest of %s already written by a retried request.", uuid)
                return
            if there == fmt.TOMBSTONE_MANIFEST:
                raise errors.CheckpointConflict(
                    f"Checkpoint {uuid} in {storage.url} was removed while its upload was "
                    "stopped (a paused process or a machine asleep: GC took it for a leftover, "
                    "or a delete or retention removed it), or the id names a deleted "
                    "checkpoint; nothing was committed. Save again under a new id."
                )
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
    record = scan.record_from(fmt.Manifest(uuid, {}), metadata, storage_url)
    record.state = PENDING
    index.record_checkpoint(record)


def record_committed(
    index: CheckpointIndex | None,
    manifest: fmt.Manifest,
    metadata: Mapping[str, Any],
    storage_url: str,
) -> CheckpointRecord:
    record = scan.record_from(manifest, metadata, storage_url)
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
    signing_key: signing.KeyPath | None = None,
) -> CheckpointRecord:
    """Commit the files of ``local_dir`` as checkpoint ``uuid`` with ``metadata``.

    ``signing_key`` (an EC private key's PEM file) signs the files (:mod:`.signing`): their
    SHA-256 comes from the read that computes their crc32c for the manifest, and the
    signature is committed with them as ``model.sig``.

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
    if signing_key is not None:
        blobs.materialize(local_dir)  # the signature's digests read every byte of every file
    prepared = PreparedFiles(local_dir, checksums, sha256=signing_key is not None)
    if signing_key is not None:
        prepared.sign(signing_key, uuid)
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
    blobs.materialize(local_dir)  # stored whole: every byte in its file
    meta_bytes = fmt.dump_json(metadata)
    manifest = fmt.Manifest.build(uuid, prepared.entries, meta_bytes)
    record_pending(index, uuid, metadata, url)
    renamed = False
    if owned and not prepared.has_reserved and storage.local_path(uuid) is not None:
        with open(os.path.join(local_dir, fmt.METADATA_NAME), "wb") as f:
            f.write(meta_bytes)
        # The marker goes in before the rename: a kill before the manifest leaves a folder GC
        # knows as ckptstore's own leftover.
        with open(os.path.join(local_dir, fmt.PENDING_MARKER_NAME), "wb") as f:
            f.write(_marker_bytes())
        renamed = storage.rename_dir_into(local_dir, uuid)
        if not renamed:
            for name in (fmt.METADATA_NAME, fmt.PENDING_MARKER_NAME):
                os.unlink(os.path.join(local_dir, name))
    if renamed:
        write_manifest(storage, uuid, manifest)
    else:
        with PendingMarker(storage, uuid) as marker:
            prepared.upload_to(storage, uuid)
            storage.write_bytes(f"{uuid}/{fmt.METADATA_NAME}", meta_bytes)
            marker.check_live()
            write_manifest(storage, uuid, manifest)
    remove_pending_marker(storage, uuid)
    if owned and not renamed:
        shutil.rmtree(local_dir, ignore_errors=True)
    size = _stored_size(manifest)
    _log_committed(uuid, storage, manifest, size, size)
    return record_committed(index, manifest, metadata, url)


def _stored_size(manifest: fmt.Manifest) -> int:
    return sum(manifest.sizes().values())


def _log_committed(
    uuid: str, storage: Storage, manifest: fmt.Manifest, size: int, new: int
) -> None:
    """The one INFO line every commit writes (the first-hour log a user reads)."""
    logger.info(
        "Checkpoint %s committed to %s: %d files, %s bytes, %s bytes new",
        uuid,
        storage.url,
        len(manifest.files),
        f"{size:,}",
        f"{new:,}",
    )


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
    """The deduplicated commit: marker naming every blob -> condemnations read -> blobs
    created create-only unless known to be stored (files using a blob a running sweep may
    delete go whole into the folder; condemned blobs are never taken as known) ->
    ``metadata.json`` -> manifest (the commit) -> marker gone. Never waits for another process (the protocol:
    :mod:`~ckptstore.checkpointing.condemned`)."""
    whole = fmt.kept_whole_in_place(storage, uuid)
    entries = blobs.plan(prepared.local_dir, prepared.entries, chunk_bytes, cuts, whole)
    meta_bytes = fmt.dump_json(metadata)
    record_pending(index, uuid, metadata, url)
    known = known_blobs.get() if known_blobs is not None else None
    checked_at = elapsed_clock()
    with PendingMarker(storage, uuid, blobs.chunk_shas(entries)) as marker:
        entries, stats = upload_entries(
            storage, uuid, prepared.local_dir, entries, chunk_bytes, marker, known, move=owned
        )
        # Empty folders ("dir/" entries) live only in the manifest: readers recreate them.
        storage.write_bytes(f"{uuid}/{fmt.METADATA_NAME}", meta_bytes)
        manifest = fmt.Manifest.build(uuid, entries, meta_bytes)
        marker.check_live()
        write_manifest(storage, uuid, manifest)
    remove_pending_marker(storage, uuid)
    if known_blobs is not None:
        known_blobs.set(manifest.blobs(), since=checked_at)
    if owned:
        shutil.rmtree(prepared.local_dir, ignore_errors=True)
    _log_committed(uuid, storage, manifest, _stored_size(manifest), stats.uploaded)
    return record_committed(index, manifest, metadata, url)


@dataclass(frozen=True)
class MarkerSeen:
    """Another process's pending marker as one rank of a sharded commit knows it: its key and
    a monotonic time taken before it was written (what :func:`upload_entries` needs)."""

    key: str
    refreshed: float


def upload_entries(
    storage: Storage,
    uuid: str,
    local_dir: str,
    entries: Mapping[str, dict[str, Any]],
    chunk_bytes: int,
    marker: PendingMarker | MarkerSeen,
    known: frozenset[str] | None = None,
    *,
    move: bool = False,
) -> tuple[dict[str, dict[str, Any]], blobs.UploadStats]:
    """Under ``marker`` (written, naming every blob of ``entries``): read GC's condemnations,
    store whole every file that needs a blob a running sweep may delete (and the files
    planned whole, :func:`~ckptstore.checkpointing.format.kept_whole_in_place`), create the
    other blobs (create-only, skipping ``known`` ones that are not condemned). Returns the
    entries as they are now stored and what was uploaded (the deduplicated commit and amend
    share this). ``move``: ``local_dir`` belongs to the caller's commit, so whole files may
    be renamed out of it."""
    threats = condemned.threats(storage, marker.key, marker.refreshed)
    entries, threatened = _whole_where_threatened(entries, threats.unsafe)
    if threatened:
        logger.info(
            "%d file(s) of checkpoint %s stored whole: GC is deleting blobs they share.",
            len(threatened),
            uuid,
        )
    blobs.materialize(local_dir, threatened)
    _store_whole(storage, uuid, local_dir, entries, move)
    if known is not None:
        known = known - threats.condemned
    return entries, blobs.upload(storage, local_dir, entries, chunk_bytes, known=known)


def _store_whole(
    storage: Storage, uuid: str, local_dir: str, entries: Mapping[str, Any], move: bool
) -> None:
    """Put the files of ``entries`` that have no blob list into the checkpoint folder: with
    ``move``, renamed there when storage is on this file system (no copy: the staging folder
    is beside the checkpoint's), uploaded otherwise."""
    paths = [rel for rel, e in entries.items() if not blobs.is_chunked(e) and not rel.endswith("/")]
    if move:
        # rename_dir_into moves a file as well as a folder (os.rename); False: copy instead.
        paths = [
            rel
            for rel in paths
            if not storage.rename_dir_into(
                os.path.join(local_dir, *rel.split("/")), f"{uuid}/{rel}"
            )
        ]
    if paths:
        storage.upload(local_dir, uuid, paths=paths)


def _whole_where_threatened(
    entries: Mapping[str, dict[str, Any]], unsafe: frozenset[str]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(entries where every file using an ``unsafe`` blob loses its blob list, those files)."""
    if not unsafe:
        return dict(entries), []
    out: dict[str, dict[str, Any]] = {}
    whole: list[str] = []
    for rel, entry in entries.items():
        if any(c.sha256 in unsafe for c in blobs.chunks_of(entry)):
            out[rel] = {k: v for k, v in entry.items() if k != "blobs"}
            whole.append(rel)
        else:
            out[rel] = entry
    return out, whole


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


#: The pending marker of a folder being removed: a removal cut short leaves a folder GC knows
#: as ckptstore's (and no writer takes it for its own upload's marker).
TOMBSTONE = fmt.dump_json({"removing": True})


def remove_files(storage: Storage, uuid: str) -> None:
    """Remove checkpoint ``uuid`` from storage: its manifest is replaced by the tombstone
    first (:func:`fence_committed`: a removal cut short leaves a folder readers ignore, never
    a checkpoint with missing files, and an amend that wakes up later cannot rewrite it), then
    the rest; the tombstone stays for good (one small object per deleted checkpoint): its
    writer may still be stopped inside a retry of its create-only manifest write (or, for a
    folder deleted before it committed, before that write), and that write must find the slot
    taken, whenever it lands. Idempotent."""
    storage.write_bytes(f"{uuid}/{fmt.PENDING_MARKER_NAME}", TOMBSTONE)
    fence_committed(storage, uuid)
    remove_marked_folder(storage, uuid)


def fence_uncommitted(storage: Storage, name: str) -> bool:
    """Take the commit slot of uncommitted folder ``name`` with the tombstone manifest,
    create-only; True if it holds the tombstone now, False if a writer committed first."""
    key = f"{name}/{fmt.MANIFEST_NAME}"
    if storage.write_if_absent(key, fmt.TOMBSTONE_MANIFEST):
        return True
    try:
        return storage.read_bytes(key) == fmt.TOMBSTONE_MANIFEST
    except errors.StorageNotFound:
        return False  # removed by hand meanwhile: judged again by the next GC


def fence_committed(storage: Storage, uuid: str, attempts: int = 5) -> None:
    """Replace the manifest of ``uuid`` (whatever it holds) with the tombstone, by a write
    conditional on what was read, so a rewrite by a late amend or partial delete either
    lands before it (and is removed with the rest) or fails."""
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    for _ in range(attempts):
        try:
            current = storage.read_bytes(key)
        except errors.StorageNotFound:
            if storage.write_if_absent(key, fmt.TOMBSTONE_MANIFEST):
                return
            continue
        if current == fmt.TOMBSTONE_MANIFEST:
            return
        try:
            if storage.replace_if_unchanged(key, current, fmt.TOMBSTONE_MANIFEST):
                return
        except errors.NotSupported:
            storage.write_bytes(key, fmt.TOMBSTONE_MANIFEST)  # no conditional writes there
            return
    raise errors.CheckpointConflict(
        f"The manifest of checkpoint {uuid} in {storage.url} kept changing while it was being "
        "deleted (an amend or partial delete running); it was not deleted. Run GC again."
    )


def replace_manifest(storage: Storage, uuid: str, before: bytes, manifest: fmt.Manifest) -> None:
    """Rewrite the manifest of committed checkpoint ``uuid`` only if it still holds the
    ``before`` bytes the caller read (a conditional write): a writer paused while GC deleted
    the checkpoint finds the tombstone there and raises CheckpointConflict, never recommits
    files that are gone. A retried write that already landed counts as done."""
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    data = manifest.to_bytes()
    try:
        if storage.replace_if_unchanged(key, before, data):
            return
    except errors.NotSupported:
        if storage.read_bytes(key) == before:  # no conditional writes there: best effort
            storage.write_bytes(key, data)
            return
    try:
        if storage.read_bytes(key) == data:
            return
    except errors.StorageNotFound:
        pass
    raise errors.CheckpointConflict(
        f"The manifest of checkpoint {uuid} in {storage.url} changed while it was being "
        "rewritten (the checkpoint was deleted, or another amend or delete ran at the same "
        "time); it was left as the other writer made it. Run the command again."
    )


def remove_marked_folder(storage: Storage, name: str) -> None:
    """Remove folder ``name`` whose pending marker is a :data:`TOMBSTONE` and whose commit
    slot is fenced: every other file, then the marker, keeping the tombstone manifest (a kill
    at any point leaves a folder GC finishes later; the slot stays fenced for good)."""
    marker, manifest = fmt.PENDING_MARKER_NAME, fmt.MANIFEST_NAME
    rest = [_glob.escape(r) for r in storage.list(name) if r not in (marker, manifest)]
    if rest:
        storage.delete(name, globs=rest)
    storage.delete(name, globs=[_glob.escape(marker)])


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
    manifest, before = fmt.load_manifest_and_bytes(storage, uuid)
    files = manifest.files
    doomed = [r for r in files if r != fmt.METADATA_NAME and select(r)]
    if not doomed:
        logger.info("delete(%s, globs=%s): nothing matched.", uuid, globs)
        return PARTIALLY_DELETED if manifest.partially_deleted else "COMMITTED"
    remaining = {r: e for r, e in files.items() if r not in doomed}
    if not set(remaining) - {fmt.METADATA_NAME}:
        delete_checkpoint(storage, uuid, index)
        return DELETED
    new_manifest = manifest.with_files(remaining, partially_deleted=True)
    if index is not None:
        # The row first: it then lists only files that stay (an index that cannot be written
        # stops the delete before anything changes in storage).
        try:
            index.set_checkpoint_state(
                uuid, PARTIALLY_DELETED, resources={r: e.size for r, e in remaining.items()}
            )
        except errors.CheckpointNotFound:
            pass  # not in the index
    replace_manifest(storage, uuid, before, new_manifest)
    storage.delete(uuid, globs=[_glob.escape(r) for r in doomed])
    logger.info("Deleted %d files of checkpoint %s (globs=%s)", len(doomed), uuid, globs)
    return PARTIALLY_DELETED


# ---- leftovers ---------------------------------------------------------------------------------
def leftover_stamp(storage: Storage, name: str) -> float | None:
    """When an uncommitted folder ckptstore wrote was last known alive, by the storage's clock:
    its pending marker's timestamp (an upload refreshes it), or for a local staging folder
    the newest modification time inside it. None when ``name`` holds no ckptstore marker (not
    ours to remove)."""
    key = f"{name}/{fmt.PENDING_MARKER_NAME}"
    try:
        if storage.read_bytes(key) == TOMBSTONE:
            return float("-inf")  # a removal cut short: finish it whatever the grace
        return storage.modified_at(key)
    except errors.StorageNotFound:
        pass
    path = storage.local_path(name)
    if name.startswith(fmt.STAGING_PREFIX) and path is not None and os.path.isdir(path):
        newest = os.path.getmtime(path)
        for root, dirs, files in os.walk(path):
            for entry in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, entry)).st_mtime)
                except FileNotFoundError:
                    continue
        return newest
    return None
