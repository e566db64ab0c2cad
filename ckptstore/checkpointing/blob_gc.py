"""Reference-counted removal of content-addressed blobs (:mod:`.blobs`), and the reverse
lookup from a blob to the checkpoints that use it.

A blob is removed only when no committed manifest and no pending marker (an upload in flight
names every blob it will reference before it looks for existing ones) in the prefix names it.
A manifest that cannot be parsed stops the sweep: nothing is removed while a checkpoint's
references are unknown. A sweep announces itself before it reads references and removes the
announcement when done; writers wait for announced sweeps before they commit (the protocol is
in :mod:`.blobs`). A sweep stops deleting before its lease ends, so a writer that outlives the
lease of a killed or stuck sweep can trust it.

Example::

    from ckptstore.checkpointing import blob_gc
    removed = blob_gc.sweep(storage)      # SHA-256s of the blobs nothing references
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
import uuid as _uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.blobs import (
    BLOBS_DIR,
    CLOCK_SKEW_SECONDS,
    REQUEST_BUDGET_SECONDS,
    SWEEP_LEASE_SECONDS,
    SWEEPS_DIR,
    blob_key,
    ended_here,
    listed,
    process_identity,
    referenced,
    sweep_ended,
    sweep_is_over,
)

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def _committed_manifests(storage: Storage) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(uuid, manifest)`` of every committed checkpoint in the prefix (an uncommitted or
    damaged one is skipped: ``checkpoint verify`` reports those)."""
    for name in storage.list_children(""):
        if not fmt.is_checkpoint_name(name):
            continue
        try:
            yield name, fmt.read_manifest(storage, name)
        except errors.InvalidCheckpoint:
            continue


def users(storage: Storage, sha256: str) -> list[str]:
    """The committed checkpoints in the prefix whose manifest names blob ``sha256``."""
    return [
        name for name, manifest in _committed_manifests(storage) if sha256 in referenced(manifest)
    ]


def _references(storage: Storage) -> set[str] | None:
    """Every blob named by a manifest or pending marker in the prefix; None when a manifest
    cannot be read (then nothing may be deleted)."""
    found: set[str] = set()
    for name in storage.list_children(""):
        if name == BLOBS_DIR or name.startswith("."):
            continue
        # The marker before the manifest: a writer writes its manifest before it removes its
        # marker, so one of the two is always seen.
        for doc in (fmt.PENDING_MARKER_NAME, fmt.MANIFEST_NAME):
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


@contextmanager
def _announced(storage: Storage, lease_seconds: float) -> Iterator[float]:
    """Announce a sweep for ``lease_seconds``; yields the monotonic time at which it must stop
    deleting. Announcements of killed sweeps, long expired, are removed on the way."""
    started_wall, started = time.time(), time.monotonic()
    name = f"{_uuid.uuid4()}.json"
    info = {
        **process_identity(),
        "started_at": started_wall,
        "expires_at": started_wall + lease_seconds,
    }
    if not storage.write_if_absent(f"{SWEEPS_DIR}/{name}", fmt.dump_json(info)):  # whole or not
        raise errors.CheckpointConflict(f"Blob sweep announcement {name} exists already.")
    try:
        _remove_expired_announcements(storage, keep=name)
        yield started + lease_seconds - CLOCK_SKEW_SECONDS - REQUEST_BUDGET_SECONDS
    finally:
        try:
            storage.delete(f"{SWEEPS_DIR}/{name}")
            sweep_ended(name, removed=True)
        except errors.StorageError as exc:
            # Writers of this process stop waiting for it now; those of other processes wait
            # until its lease is over; our next sweep removes it.
            sweep_ended(name, removed=False)
            logger.warning("Could not remove the blob sweep announcement %s: %s", name, exc)


def _remove_expired_announcements(storage: Storage, keep: str) -> None:
    now = time.time()
    for rel in storage.list(SWEEPS_DIR):
        if rel == keep:
            continue
        try:
            info = json.loads(storage.read_bytes(f"{SWEEPS_DIR}/{rel}"))
            expires = float(info["expires_at"])
        except errors.StorageNotFound:
            continue
        except (ValueError, TypeError, KeyError, AttributeError):
            storage.delete(f"{SWEEPS_DIR}/{rel}")  # damaged: writers ignore it already
            continue
        if sweep_is_over(info, expires, now) or ended_here(rel):
            storage.delete(f"{SWEEPS_DIR}/{rel}")
            sweep_ended(rel, removed=True)


def sweep(
    storage: Storage, *, dry_run: bool = False, lease_seconds: float = SWEEP_LEASE_SECONDS
) -> list[str]:
    """Delete the blobs no committed checkpoint and no in-flight upload references.

    References are read twice (before and after listing the blobs) so an upload that wrote
    its pending marker meanwhile is seen; uploads that write theirs later wait for this sweep
    to end before they commit. Deleting stops when the lease (minus the tolerated clock
    skew) is over; the rest waits for the next sweep. Returns the removed (or removable)
    SHA-256s."""
    if not storage.exists(BLOBS_DIR):
        return []
    if dry_run:
        return _unreferenced(storage)
    with _announced(storage, lease_seconds) as deadline:
        doomed = _unreferenced(storage)
        removed = []
        for sha in doomed:
            if time.monotonic() >= deadline:
                logger.warning(
                    "Blob sweep stopped after %d of %d blobs: its lease is over (the next GC "
                    "goes on).",
                    len(removed),
                    len(doomed),
                )
                break
            storage.delete(blob_key(sha))
            removed.append(sha)
    if removed:
        logger.info("Blob sweep removed %d blobs", len(removed))
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
        for sha in referenced(manifest):
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
