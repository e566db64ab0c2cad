"""Adding files to a checkpoint that is already committed (e.g. a SavedModel exported later).

A committed checkpoint is immutable to readers: what its ``MANIFEST.json`` lists is what they
download and verify. Adding files keeps the same UUID (model versions, registry rows and the
user's notes keep pointing at it) and uses the manifest-rewrite protocol of partial deletes,
in the other direction:

1. read the manifest; the new paths must not be listed yet (:class:`CheckpointConflict`);
2. remove unlisted leftovers under the new files' top-level names (an earlier attempt that
   was cut short), then upload the new files. They are not in the manifest, so readers neither
   download nor verify them: a crash here leaves the checkpoint exactly as it was;
3. re-read the manifest; if it changed since step 1 (another writer), stop with
   :class:`CheckpointConflict` (the files stay unlisted, the checkpoint unchanged);
4. replace the manifest with one listing the old and new files (a single-object replace on
   every backend: local files are renamed into place, object stores replace whole objects),
   so a reader sees either the old checkpoint or the new one, never a mix. The replace is
   conditional on the exact bytes read in step 1
   (:func:`~ckptstore.checkpointing.commit.replace_manifest`): a writer paused while GC
   deleted the checkpoint (which fences the manifest with a tombstone) gets
   :class:`CheckpointConflict` and never lists files whose bytes are gone;
5. update the index row (resources); a crash before this leaves the index behind storage,
   which ``ckptstore reindex`` repairs (storage is the source of truth).

A file may be *replaced* only where the caller names it (``replace=``: the signature, when an
export signs the checkpoint again). In a deduplicated checkpoint its new entry (new blobs)
replaces the old one in step 4's single manifest rewrite. In a whole-file checkpoint the file is
overwritten in place, so the manifest is first rewritten without it: a crash in between leaves
a consistent checkpoint without that file (an unsigned one), never a listed file whose content
differs from its checksum.

``metadata.json`` is never rewritten (its checksum is in the manifest; rewriting it and the
manifest could not be one step). Two rewrites of one manifest at the same time (this and a
partial delete) are not serialised beyond step 3's check: do not run them together.

Example::

    from ckptstore.checkpointing import amend
    record = amend.add_files(storage, "0b7c...", "/tmp/export")  # adds /tmp/export/* files
"""

from __future__ import annotations

import glob as _glob
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.commit import (
    PendingMarker,
    PreparedFiles,
    record_committed,
    remove_pending_marker,
    replace_manifest,
    upload_entries,
)
from ckptstore.checkpointing.index import CheckpointIndex, CheckpointRecord

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def add_files(
    storage: Storage,
    uuid: str,
    local_dir: str,
    *,
    index: CheckpointIndex | None = None,
    storage_url: str | None = None,
    dedup_chunk_bytes: int | None = None,
    cuts: Mapping[str, Iterable[int]] | None = None,
    replace: Collection[str] = (),
) -> CheckpointRecord:
    """Add every file under ``local_dir`` to committed checkpoint ``uuid`` (same relative
    paths); returns the checkpoint's new record. See the module docstring for the protocol.

    The new files follow the checkpoint's format: a deduplicated checkpoint (format 2) gets
    them as content-addressed chunks (``dedup_chunk_bytes``, default 4 MiB; ``cuts`` as in
    :func:`~ckptstore.checkpointing.commit.commit_dir`, e.g. a SavedModel's tensors), under a
    pending marker like any commit (:func:`~ckptstore.checkpointing.commit.upload_entries`),
    except the files a local store keeps whole in place
    (:func:`~ckptstore.checkpointing.format.kept_whole_in_place`: ``saved_model/``); a
    whole-file checkpoint gets whole files.

    ``replace``: paths that may already be listed, whose new content replaces the old (see
    the module docstring).

    Raises :class:`~ckptstore.errors.CheckpointConflict` when a path is already listed or the
    manifest changed meanwhile, :class:`~ckptstore.errors.InvalidCheckpoint` when ``uuid`` is
    not committed, :class:`~ckptstore.errors.InvalidConfig` for reserved names.
    """
    fmt.check_storage_id(uuid)
    # Raises InvalidCheckpoint if not committed; ``raw`` is what the rewrite must find there.
    manifest, raw = fmt.load_manifest_and_bytes(storage, uuid)
    before = raw
    prepared = PreparedFiles(local_dir)
    if prepared.has_reserved:
        raise errors.InvalidConfig(
            f"{local_dir!r} holds {sorted(fmt.RESERVED_NAMES)} names, which ckptstore writes "
            "itself; add only your own files to a checkpoint."
        )
    if not prepared.entries:
        raise errors.InvalidConfig(
            f"{local_dir!r} holds no files to add to checkpoint {uuid}; pass a folder with files."
        )
    clash = sorted(set(prepared.entries) & set(manifest.files) - set(replace))
    if clash:
        raise errors.CheckpointConflict(
            f"Checkpoint {uuid} already lists {clash[:5]}; files of a committed checkpoint are "
            "never replaced. Delete them first (`ckptstore checkpoint delete UUID --glob ...`) "
            f"to replace them. Received: {local_dir!r}"
        )
    _remove_unlisted(storage, uuid, manifest, prepared.entries)
    if manifest.deduplicated:
        chunk = blobs.DEFAULT_CHUNK_BYTES if dedup_chunk_bytes is None else dedup_chunk_bytes
        whole = fmt.kept_whole_in_place(storage, uuid)  # an export's saved_model/, locally
        entries = blobs.plan(local_dir, prepared.entries, chunk, cuts, whole)
        with PendingMarker(storage, uuid, blobs.chunk_shas(entries)) as marker:
            entries, _stats = upload_entries(storage, uuid, local_dir, entries, chunk, marker)
            new_manifest = _rewrite(storage, uuid, manifest, before, entries)
            marker.check_live()
            replace_manifest(storage, uuid, raw, new_manifest)
        remove_pending_marker(storage, uuid)
    else:
        replaced = set(replace) & set(manifest.files) & set(prepared.entries)
        if replaced:  # never list a file whose content is being overwritten
            manifest = _rewrite(storage, uuid, manifest, before, {}, drop=replaced)
            replace_manifest(storage, uuid, raw, manifest)
            before = raw = manifest.to_bytes()
        prepared.upload_to(storage, uuid)
        new_manifest = _rewrite(storage, uuid, manifest, before, prepared.entries)
        replace_manifest(storage, uuid, raw, new_manifest)
    logger.info("Added %d files to checkpoint %s in %s", len(prepared.entries), uuid, storage.url)
    metadata = ckpt_metadata.read_metadata(storage, uuid)
    metadata.setdefault("uuid", uuid)
    return record_committed(index, new_manifest, metadata, storage_url or storage.url)


def _rewrite(
    storage: Storage,
    uuid: str,
    manifest: fmt.Manifest,
    before: bytes,
    entries: dict[str, Any],
    drop: Collection[str] = (),
) -> fmt.Manifest:
    """The manifest listing the old files (less ``drop``) and the new ones, after checking
    nobody rewrote it since."""
    try:
        now = storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}")
    except errors.StorageNotFound:
        now = b""
    if now != before:
        raise errors.CheckpointConflict(
            f"The manifest of checkpoint {uuid} changed while files were being added to it "
            "(another delete or add ran at the same time); it was left as the other writer "
            "made it. Run the command again."
        )
    files = {rel: entry for rel, entry in manifest.files.items() if rel not in drop}
    files.update(entries)
    return manifest.with_files(files)


def _remove_unlisted(
    storage: Storage, uuid: str, manifest: fmt.Manifest, new: dict[str, Any]
) -> None:
    """Delete files under the new entries' top-level names that the manifest does not list
    (left by an attempt cut short), so the folder holds exactly what the new manifest lists."""
    tops = {rel.split("/", 1)[0] for rel in new}
    listed = set(manifest.files) | fmt.RESERVED_NAMES
    stale = sorted(
        rel for rel in storage.list(uuid) if rel.split("/", 1)[0] in tops and rel not in listed
    )
    if stale:
        logger.info("Removing %d unlisted leftover files from checkpoint %s", len(stale), uuid)
        storage.delete(uuid, globs=[_glob.escape(r) for r in stale])
