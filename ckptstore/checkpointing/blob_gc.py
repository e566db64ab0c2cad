"""Reference-counted removal of content-addressed blobs (:mod:`.blobs`), and the reverse
lookup from a blob to the checkpoints that use it.

A blob is removed only when no committed manifest and no pending marker in the prefix names
it, and only through a condemnation whose delete window writers check
(:mod:`.condemned`): a sweep never makes a save wait, and a killed, hung or clock-skewed sweep
cannot remove a blob a writer then commits. A manifest that cannot be parsed stops the sweep:
nothing is removed while a checkpoint's references are unknown.

Example::

    from ckptstore.checkpointing import blob_gc
    removed = blob_gc.sweep(storage)      # SHA-256s of the blobs nothing references
"""

from __future__ import annotations

import hashlib
import logging
import random
import uuid as _uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import condemned, jsonfiles
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.blobs import BLOBS_DIR, blob_key, listed, marker_blobs
from ckptstore.checkpointing.condemned import Condemnation, StorageClock

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def _committed_manifests(storage: Storage) -> Iterator[tuple[str, fmt.Manifest]]:
    """``(uuid, manifest)`` of every committed checkpoint in the prefix (an uncommitted or
    damaged one is skipped: ``checkpoint verify`` reports those)."""
    for name in storage.list_children(""):
        if not fmt.is_checkpoint_name(name):
            continue
        try:
            yield name, fmt.load_manifest(storage, name)
        except errors.InvalidCheckpoint:
            continue


def users(storage: Storage, sha256: str) -> list[str]:
    """The committed checkpoints in the prefix whose manifest names blob ``sha256``."""
    return [name for name, manifest in _committed_manifests(storage) if sha256 in manifest.blobs()]


def _references(storage: Storage) -> set[str] | None:
    """Every blob named by a manifest or pending marker in the prefix; None when a manifest
    cannot be read (then nothing may be deleted)."""
    found: set[str] = set()
    for name in storage.list_children(""):
        if name == BLOBS_DIR or name.startswith("."):
            continue
        # The marker before the manifest: a writer writes its manifest before it removes its
        # marker, so one of the two is always seen.
        try:
            key = f"{name}/{fmt.PENDING_MARKER_NAME}"
            marker = jsonfiles.load_json(storage.read_bytes(key), key, fmt.MAX_MANIFEST_BYTES)
            found |= marker_blobs(marker)
        except errors.StorageNotFound:
            pass
        except errors.InvalidCheckpoint:
            pass  # a damaged marker names nothing (markers are ours: written whole)
        try:
            data = storage.read_bytes(f"{name}/{fmt.MANIFEST_NAME}")
        except errors.StorageNotFound:
            continue
        if data == fmt.TOMBSTONE_MANIFEST:
            continue  # a deleted checkpoint's fence names nothing
        try:
            found |= fmt.Manifest.parse(data, name).blobs()
        except errors.InvalidCheckpoint as exc:
            logger.warning("Blob sweep skipped: %s/%s: %s", name, fmt.MANIFEST_NAME, exc)
            return None
    return found


def sweep(
    storage: Storage,
    *,
    dry_run: bool = False,
    delay_seconds: float = condemned.DEFAULT_DELAY_SECONDS,
    window_seconds: float = condemned.DEFAULT_WINDOW_SECONDS,
) -> list[str]:
    """Delete the blobs no committed checkpoint and no in-flight upload references.

    Deletes what earlier sweeps condemned once their window is open, then condemns what is
    unreferenced now; with ``delay_seconds=0`` (the default) those are deleted in the same
    call. Deletes re-read references after claiming and stay inside their window, judged on
    the storage's clock (the protocol: :mod:`.condemned`). Never waits for another process.
    Returns the removed (or, with ``dry_run``, removable) SHA-256s."""
    if not storage.exists(BLOBS_DIR):
        return []
    if dry_run:
        return _unreferenced(storage)
    listing = condemned.read_all(storage)
    clock = StorageClock.probe(storage)
    condemned.clean_probes(storage, clock)
    ready: list[Condemnation] = []
    waiting: set[str] = set()
    for cond in listing.condemnations.values():
        if cond.spent(clock.now()):
            condemned.forget(storage, cond.name, listing)
            continue
        if cond.opens <= clock.stamp and clock.now() < _last_send(cond):
            ready.append(cond)
        if cond.closes > clock.now():  # its window may still delete them: not condemned twice
            waiting |= cond.blobs
    for name in listing.bad:  # honoured by nobody, so removing them changes nothing
        condemned.forget(storage, name, listing)
    removed = _execute(storage, ready, clock)
    fresh = condemned.condemn(
        storage,
        set(_unreferenced(storage)) - waiting - removed,
        delay=delay_seconds,
        window=window_seconds,
    )
    if fresh is not None and fresh.delay == 0:
        clock = StorageClock.probe(storage)  # written after the condemnation: stamped later
        if fresh.opens <= clock.stamp:
            removed |= _execute(storage, [fresh], clock)
    if removed:
        logger.info("Blob sweep removed %d blobs", len(removed))
    return sorted(removed)


def _last_send(cond: Condemnation) -> float:
    """The storage time after which no delete of ``cond`` may be sent: one request's whole
    retry budget before its window closes, so every delete lands inside it."""
    return cond.closes - condemned.REQUEST_BUDGET_SECONDS


def _execute(storage: Storage, conds: list[Condemnation], clock: StorageClock) -> set[str]:
    """Claim ``conds``, read references *after* the claims (a writer that saw no claim wrote
    its marker before them, so the marker is read), delete what is still unreferenced while
    each window allows, then say done. A sweep killed or failing midway leaves its claims
    without ``done``: writers avoid those blobs until the window closes."""
    if not conds:
        return set()
    run = _uuid.uuid4().hex
    for cond in conds:
        condemned.mark(storage, cond.name, "claim", run)
    refs = _references(storage)
    removed: set[str] = set()
    if refs is not None:
        stored = listed(storage)
        for cond in conds:
            doomed = sorted((cond.blobs & stored) - refs - removed)
            for sha in doomed:
                if clock.now() >= _last_send(cond):
                    logger.warning(
                        "Blob sweep stopped after %d of %d blobs: the delete window of "
                        "condemnation %s is closing (a later sweep condemns the rest again).",
                        len(removed),
                        len(doomed),
                        cond.name,
                    )
                    break
                storage.delete(blob_key(sha))
                removed.add(sha)
    for cond in conds:
        condemned.mark(storage, cond.name, "done", run)
    return removed


def _unreferenced(storage: Storage) -> list[str]:
    first = _references(storage)
    if first is None:
        return []
    stored = listed(storage)
    second = _references(storage)
    if second is None:
        return []
    return sorted(stored - first - second)


def check(storage: Storage, sample: int | None = None, *, workers: int = 8) -> dict[str, Any]:
    """Check the blob store of the prefix against its committed manifests: every blob a
    manifest names must be there (one listing), and ``sample`` blobs picked at random
    (``None``: all of them) are read and their SHA-256 checked. Returns ``{"stored",
    "referenced", "checked", "missing": {sha: [uuid, ...]}, "damaged": {sha: [uuid, ...]}}``
    (each bad blob with every checkpoint that uses it). Reading every blob downloads the
    whole store, so the default of ``ckptstore storage validate`` is a sample."""
    using: dict[str, list[str]] = {}
    for name, manifest in _committed_manifests(storage):
        for sha in manifest.blobs():
            using.setdefault(sha, []).append(name)
    stored = listed(storage) if using else set()
    present = sorted(set(using) & stored)
    if sample is not None and sample < len(present):
        present = random.sample(present, sample)

    def damaged(sha: str) -> bool:
        try:
            data = storage.read_bytes(blob_key(sha))
        except errors.StorageNotFound:
            return True  # removed since the listing: as bad for its users
        return hashlib.sha256(data).hexdigest() != sha

    bad: list[str] = []
    if present:
        with ThreadPoolExecutor(max(1, min(workers, len(present)))) as pool:
            bad = [s for s, b in zip(present, pool.map(damaged, present), strict=True) if b]
    return {
        "stored": len(stored),
        "referenced": len(using),
        "checked": len(present),
        "missing": {s: sorted(using[s]) for s in sorted(set(using) - stored)},
        "damaged": {s: sorted(using[s]) for s in sorted(bad)},
    }
