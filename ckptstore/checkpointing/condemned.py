"""The blob GC protocol: a sweep never makes a writer wait, and no committed checkpoint ever
names a missing blob.

Deleting a shared, content-addressed blob races with a writer that finds it in storage and
reuses it. Backup tools that share such repositories between writers (restic, Kopia, git's
gc) solve it without making writers wait on the collector, and so does ckptstore:

1. **Condemn.** A sweep lists the blobs no committed manifest and no pending marker names and
   writes them, create-only, to ``.ckptstore-blobs/.condemned/<id>.json``. That file's own
   timestamp on the storage (:meth:`~ckptstore.storage_backends.base.Storage.modified_at`),
   ``t``, dates the condemnation. Nothing is deleted yet.
2. **Delete within a window, under a claim.** The condemned blobs may be deleted only during
   ``[t + delay, t + delay + window]``, by the storage's clock: a sweep writes a probe object
   to read the storage's time, writes a claim (``<id>.json.claim-<run>``) on each condemnation
   it executes, re-reads every manifest and marker *after* the claims, and deletes the
   condemned blobs still unreferenced, sending no delete later than ``REQUEST_BUDGET_SECONDS``
   before the window closes (its own monotonic clock bounds the storage's time from the
   probe's stamp). It then writes ``<id>.json.done-<run>``. A sweep killed, hung or resumed
   later deletes nothing after the window.
3. **Writers check, never wait.** A writer writes its pending marker (naming every blob it
   will reference) first, reads the marker's storage timestamp ``m``, then lists the
   condemnations. A claim without its ``done`` may belong to a sweep that read references
   before the marker existed: unless that condemnation's window closed before ``m`` (within
   ``STAMP_SLACK_SECONDS``), the writer stores every file that would use one of its blobs
   *whole* in the checkpoint folder instead (a format-2 manifest holds both kinds of entries).
   A claim written after the listing belongs to a sweep that reads references after it, so it
   keeps the writer's blobs; a finished one has deleted what it will, so a reused blob it
   condemned is checked once (HEAD) and uploaded again if gone.

Only storage timestamps are compared with each other; a collector or writer whose wall clock
is a day off changes nothing. A condemnation file that cannot be parsed, or whose delay or
window exceeds the caps, is ignored by writers and sweeps alike (and removed by sweeps), so a
hostile or damaged file can neither stall a save nor license a delete.

Example::

    from ckptstore.checkpointing import condemned
    now = condemned.StorageClock.probe(storage)           # the storage's own time
    for c in condemned.read_all(storage):
        print(c.name, len(c.blobs), c.opens, c.closes)
"""

from __future__ import annotations

import json
import logging
import threading
import uuid as _uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.blobs import BLOBS_DIR, SHA_RE
from ckptstore.checkpointing.clock import elapsed_clock

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: Where sweeps write their condemnations (not a blob name: blob folders are 2 hex digits).
CONDEMNED_DIR = f"{BLOBS_DIR}/.condemned"
#: Where probes that read the storage's clock are written (and removed at once).
CLOCK_DIR = ".ckptstore-clock"
#: How long one storage request may take with all its retries (5 tries of a 60 s timeout plus
#: backoff): a sweep sends no delete later than this before its window closes.
REQUEST_BUDGET_SECONDS = 300.0
#: How far an object's timestamp may be from the moment it became visible: one request's
#: duration (a retried write gets a new stamp) plus S3's whole-second stamps.
STAMP_SLACK_SECONDS = 120.0
#: Default time between a condemnation and the start of its deletes. Correctness does not
#: depend on it (writers check windows, whatever their length); a longer delay only keeps
#: unreferenced blobs longer, for restores of checkpoints deleted by mistake.
DEFAULT_DELAY_SECONDS = 0.0
#: Default length of the delete window.
DEFAULT_WINDOW_SECONDS = 900.0
#: Caps a condemnation must respect to be honoured (hostile files license nothing).
MAX_DELAY_SECONDS = 30 * 86400.0
MAX_WINDOW_SECONDS = 3600.0
#: A condemnation file is removed this long after its window closed. A writer reads the
#: condemnations within this time of its marker (it checks), so it never misses one whose
#: deletes could touch its blobs.
KEEP_SPENT_SECONDS = 3600.0
#: Largest condemnation file read (about a million blobs).
MAX_CONDEMNATION_BYTES = 128 * 2**20


@dataclass(frozen=True)
class StorageClock:
    """The storage's time, read once from a probe's stamp, then advanced by this process's
    monotonic clock (an upper bound: the stamp was made after the request started)."""

    stamp: float
    started: float

    @classmethod
    def probe(cls, storage: Storage) -> StorageClock:
        """Write, stamp and remove a probe object. Raises NotSupported on a storage that
        cannot tell when an object was written."""
        key = f"{CLOCK_DIR}/{_uuid.uuid4().hex}"
        started = _monotonic()
        storage.write_bytes(key, b"")
        try:
            return cls(storage.modified_at(key), started)
        finally:
            try:
                storage.delete(key)
            except errors.StorageError as exc:
                logger.debug("Could not remove the clock probe %s: %s", key, exc)

    def now(self) -> float:
        """An upper bound of the storage's time now."""
        return self.stamp + (_monotonic() - self.started)


#: A clock probe or a local temporary file older than this was left by a killed process (a
#: live one lasts a request or a write; removing one early only makes that step fail).
DEBRIS_SECONDS = 60.0


def clean_probes(storage: Storage, clock: StorageClock, older_than: float = DEBRIS_SECONDS) -> None:
    """Remove clock probes killed processes left."""
    for rel in storage.list(CLOCK_DIR):
        key = f"{CLOCK_DIR}/{rel}"
        try:
            if storage.modified_at(key) <= clock.stamp - older_than:
                storage.delete(key)
        except errors.StorageNotFound:
            continue


def _monotonic() -> float:
    # Counts time asleep, so a laptop that wakes up cannot believe less time has passed than
    # the storage saw (the one clock: checkpointing.clock).
    return elapsed_clock()


@dataclass(frozen=True)
class Condemnation:
    """One sweep's list of blobs to delete, and the storage-clock window it may delete them in."""

    name: str
    stamp: float
    delay: float
    window: float
    blobs: frozenset[str]

    @property
    def opens(self) -> float:
        return self.stamp + self.delay

    @property
    def closes(self) -> float:
        return self.stamp + self.delay + self.window

    def spent(self, now: float) -> bool:
        """No delete of it can happen any more (and no writer still needs to see it)."""
        return now > self.closes + STAMP_SLACK_SECONDS + KEEP_SPENT_SECONDS


@dataclass
class Listing:
    """The condemnation folder as one listing shows it."""

    #: Valid condemnations, by file name.
    condemnations: dict[str, Condemnation]
    #: Damaged or hostile files (honoured by nobody; sweeps remove them).
    bad: list[str]
    #: Per condemnation: the runs that claimed it, and those that finished.
    claims: dict[str, set[str]]
    dones: dict[str, set[str]]

    def running(self, name: str) -> bool:
        """Whether a sweep claimed condemnation ``name`` and has not said it finished."""
        return bool(self.claims.get(name, set()) - self.dones.get(name, set()))


#: Condemnations are immutable: each is read once per process.
_READ: dict[tuple[str, str], Condemnation | None] = {}
_READ_LOCK = threading.Lock()


def _parse(name: str, data: bytes, stamp: float) -> Condemnation | None:
    try:
        info = json.loads(data)
        delay, window, shas = info["delay_seconds"], info["window_seconds"], info["blobs"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    numbers_ok = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v == v for v in (delay, window)
    )
    if not numbers_ok or not (0 <= delay <= MAX_DELAY_SECONDS and 0 < window <= MAX_WINDOW_SECONDS):
        return None
    if not isinstance(shas, list) or not all(isinstance(s, str) and SHA_RE.match(s) for s in shas):
        return None
    return Condemnation(name, stamp, float(delay), float(window), frozenset(shas))


def _read_one(storage: Storage, name: str, size: int) -> Condemnation | None:
    cache_key = (storage.url, name)
    with _READ_LOCK:
        if cache_key in _READ:
            return _READ[cache_key]
    key = f"{CONDEMNED_DIR}/{name}"
    if size > MAX_CONDEMNATION_BYTES:
        parsed = None
    else:
        parsed = _parse(name, storage.read_bytes(key), storage.modified_at(key))
    with _READ_LOCK:
        _READ[cache_key] = parsed
    return parsed


def read_all(storage: Storage) -> Listing:
    """One listing of the condemnation folder, each condemnation read (once per process)."""
    listing = Listing({}, [], {}, {})
    files = storage.list(CONDEMNED_DIR)
    for rel in files:
        base, sep, run = rel.partition(".json.")
        if sep and run.startswith(("claim-", "done-")) and "/" not in rel:
            kind = listing.claims if run.startswith("claim-") else listing.dones
            kind.setdefault(base + ".json", set()).add(run.split("-", 1)[1])
    for rel, size in files.items():
        if ".json." in rel:
            continue
        if "/" in rel or not rel.endswith(".json"):
            listing.bad.append(rel)
            continue
        try:
            parsed = _read_one(storage, rel, size)
        except errors.StorageNotFound:
            continue  # removed since the listing
        if parsed is None:
            logger.warning("Ignoring the damaged blob condemnation %s/%s.", CONDEMNED_DIR, rel)
            listing.bad.append(rel)
        else:
            listing.condemnations[rel] = parsed
    return listing


def condemn(
    storage: Storage, shas: Iterable[str], *, delay: float, window: float
) -> Condemnation | None:
    """Write a condemnation of ``shas`` (create-only); None if there is nothing to condemn."""
    blobs = sorted(set(shas))
    if not blobs:
        return None
    if not (0 <= delay <= MAX_DELAY_SECONDS and 0 < window <= MAX_WINDOW_SECONDS):
        raise errors.InvalidConfig(
            f"Blob GC delay must be in [0, {MAX_DELAY_SECONDS:.0f}] s and window in (0, "
            f"{MAX_WINDOW_SECONDS:.0f}] s. Received: delay={delay!r}, window={window!r}"
        )
    name = f"{_uuid.uuid4().hex}.json"
    key = f"{CONDEMNED_DIR}/{name}"
    body = {"delay_seconds": delay, "window_seconds": window, "blobs": blobs}
    if not storage.write_if_absent(key, fmt.dump_json(body)):
        raise errors.CheckpointConflict(f"Blob condemnation {key} exists already.")
    return Condemnation(name, storage.modified_at(key), delay, window, frozenset(blobs))


def mark(storage: Storage, name: str, kind: str, run: str) -> None:
    """Write the ``claim`` or ``done`` file of sweep ``run`` on condemnation ``name``."""
    storage.write_bytes(f"{CONDEMNED_DIR}/{name}.{kind}-{run}", b"")


def forget(storage: Storage, name: str, listing: Listing) -> None:
    """Remove condemnation ``name`` (a spent or bad one) with its claims and dones."""
    runs = [f"claim-{r}" for r in listing.claims.get(name, ())]
    runs += [f"done-{r}" for r in listing.dones.get(name, ())]
    try:
        for suffix in runs:
            storage.delete(f"{CONDEMNED_DIR}/{name}.{suffix}")
        storage.delete(f"{CONDEMNED_DIR}/{name}")
    except errors.StorageError as exc:
        logger.warning("Could not remove the blob condemnation %s: %s", name, exc)


@dataclass(frozen=True)
class Threats:
    """What a writer learnt from the condemnations after writing its marker."""

    #: Blobs a running sweep may delete without having seen the marker: not to be used.
    unsafe: frozenset[str]
    #: Every condemned blob: a writer's belief that one is stored is not to be trusted (a
    #: finished sweep may have deleted it); it is asked for with a create-only write instead.
    condemned: frozenset[str]


def threats(storage: Storage, marker_key: str, marker_started: float) -> Threats:
    """Read the condemnations after the marker at ``marker_key`` was written (its write
    started at ``marker_started``, :func:`_monotonic`)."""
    listing = read_all(storage)
    if not listing.condemnations:
        return Threats(frozenset(), frozenset())
    try:
        stamp: float | None = storage.modified_at(marker_key)
    except errors.NotSupported:
        stamp = None  # cannot place the marker in time: trust no running sweep
    if _monotonic() - marker_started > KEEP_SPENT_SECONDS / 2:
        # A condemnation may have been removed before we listed them: commit nothing rather
        # than rely on the listing.
        raise errors.CheckpointError(
            "The upload stalled between writing its pending marker and reading the blob GC "
            f"condemnations (over {KEEP_SPENT_SECONDS / 2:.0f} s); nothing was committed. Save "
            "again."
        )
    conds = listing.condemnations.values()
    unsafe = frozenset().union(
        *(
            c.blobs
            for c in conds
            if listing.running(c.name)
            and (stamp is None or stamp <= c.closes + STAMP_SLACK_SECONDS)
        )
    )
    return Threats(unsafe, frozenset().union(*(c.blobs for c in conds)))
