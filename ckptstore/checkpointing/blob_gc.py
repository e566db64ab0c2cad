"""Reference-counted removal of content-addressed blobs (:mod:`.blobs`), and the reverse
lookup from a blob to the checkpoints that use it.

A blob is removed only when no committed manifest and no pending marker (an upload in flight
names every blob it will reference before it looks for existing ones) in the prefix names it.
A manifest that cannot be parsed stops the sweep: nothing is removed while a checkpoint's
references are unknown.

Example::

    from ckptstore.checkpointing import blob_gc
    removed = blob_gc.sweep(storage)      # SHA-256s of the blobs nothing references
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.blobs import BLOBS_DIR, SHA_RE, blob_key, referenced

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def users(storage: Storage, sha256: str) -> list[str]:
    """The committed checkpoints in the prefix whose manifest names blob ``sha256``."""
    found = []
    for name in storage.list_children(""):
        if not fmt.is_checkpoint_name(name):
            continue
        try:
            manifest = fmt.read_manifest(storage, name)
        except errors.InvalidCheckpoint:
            continue
        if sha256 in referenced(manifest):
            found.append(name)
    return found


def _references(storage: Storage) -> set[str] | None:
    """Every blob named by a manifest or pending marker in the prefix; None when a manifest
    cannot be read (then nothing may be deleted)."""
    found: set[str] = set()
    for name in storage.list_children(""):
        if name == BLOBS_DIR or name.startswith("."):
            continue
        for doc in (fmt.MANIFEST_NAME, fmt.PENDING_MARKER_NAME):
            try:
                data = json.loads(storage.read_bytes(f"{name}/{doc}"))
            except errors.StorageNotFound:
                continue
            except ValueError:
                if doc == fmt.MANIFEST_NAME:
                    logger.warning("Blob sweep skipped: %s/%s is not valid JSON.", name, doc)
                    return None
                continue
            if isinstance(data, dict):
                found |= referenced(data)
    return found


def sweep(storage: Storage, *, dry_run: bool = False) -> list[str]:
    """Delete the blobs no committed checkpoint and no in-flight upload references.

    References are read twice (before and after listing the blobs) so an upload that wrote
    its pending marker meanwhile is seen. Returns the removed (or removable) SHA-256s."""
    if not storage.exists(BLOBS_DIR):
        return []
    first = _references(storage)
    if first is None:
        return []
    stored = {
        rel.rsplit("/", 1)[-1]
        for rel in storage.list(BLOBS_DIR)
        if SHA_RE.match(rel.rsplit("/", 1)[-1])
    }
    second = _references(storage)
    if second is None:
        return []
    doomed = sorted(stored - first - second)
    if not dry_run:
        for sha in doomed:
            storage.delete(blob_key(sha))
    if doomed:
        logger.info("Blob sweep %s %d blobs", "would remove" if dry_run else "removed", len(doomed))
    return doomed
