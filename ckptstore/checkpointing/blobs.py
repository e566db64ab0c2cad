"""Content-addressed blobs: a checkpoint file stored as a list of chunks, each kept once per
storage prefix, so bytes already in storage are neither uploaded nor stored again.

Layout (``format_version`` 2)::

    <prefix>/.ckptstore-blobs/<sha256[:2]>/<sha256>      one chunk, immutable, create-only
    <prefix>/<uuid>/metadata.json
    <prefix>/<uuid>/MANIFEST.json                        written last: the commit

A manifest entry of a deduplicated file keeps ``size`` and ``crc32c`` of the whole file and adds
``"blobs": [{"sha256": ..., "size": ...}, ...]``, the chunks it is made of, in order. Choices
made where the issue is silent:

- The key is the SHA-256 of the chunk (CRC-32C, 32 bits, collides after ~10^5 chunks by the
  birthday bound; SHA-256 does not in practice). CRC-32C of the whole file is still checked
  after reassembly, so a reader verifies both.
- Chunks are cut where the writer says a piece of content begins or ends (``cuts``: the
  byte ranges of the tensors of ckptstore's ``model.keras`` and, read from their ``.index``,
  of TensorFlow checkpoint shards such as a SavedModel's ``variables/``), so a changed tensor costs its
  own bytes: a piece larger than ``chunk_bytes`` (4 MiB by default) is split every
  ``chunk_bytes`` from its own start, and runs of tiny pieces (HDF5 headers, biases,
  counters, each of at most :data:`ALONE_BYTES`) are merged up to :data:`MERGE_BYTES`, so the
  number of requests stays near the number of large tensors. A file without cuts is cut
  every ``chunk_bytes`` at fixed offsets (a file whose layout does not move still shares
  every chunk that did not change).
- Requests: a writer skips asking storage about blobs its previous commit named
  (:class:`KnownBlobs`; the first commit of a writer lists the blob folder once instead) and
  creates every other blob with a create-only write, one request each. Blobs it relies on
  without creating them are rechecked before the commit as below, so a stale belief costs
  one upload, never a missing blob.
- The blob folder starts with ``.`` so no listing of checkpoints ever takes it for one.
- An in-flight upload names every blob it will reference in its pending marker *before* it
  looks for existing blobs; a sweep (run by GC) never deletes a blob a committed manifest or
  any pending marker names. A sweep may still have read the references *before* a writer's
  marker appeared, and then delete a blob that writer found and reuses. So every sweep
  announces itself (``.ckptstore-blobs/.sweeps/<id>.json``, with a lease) before it reads
  references, and a writer, before its commit, waits until no sweep that was announced is
  still running (:func:`wait_for_sweeps`), then checks its reused blobs again
  (:func:`recheck`, re-uploading any that a sweep removed). A sweep that starts after that
  check sees the writer's marker (or manifest), so no committed checkpoint points at a
  missing blob, whenever either process is killed. The sweep and the reverse lookup live in
  :mod:`~ckptstore.checkpointing.blob_gc`.

Example::

    from ckptstore.checkpointing import blobs
    chunks = blobs.chunk_file("/tmp/ckpt/model.keras")   # [{"sha256", "size"}, ...]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.storage_backends.object_store import tmp_name

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

BLOBS_DIR = ".ckptstore-blobs"
DEFAULT_CHUNK_BYTES = 4 * 2**20
#: Threads uploading blobs of one checkpoint.
UPLOAD_WORKERS = 8
#: A piece between two cuts of at most this many bytes (an HDF5 header, a counter, a bias of
#: up to 1024 float32 units) is merged with its small neighbours ... Measured
#: (benchmarks/incremental.py): merging the 4 KiB biases of a Dense stack with the headers
#: around them halves its chunks (a restore as fast as whole-file on moto, from 1.37x); 8 KiB
#: also merged callback_state.json's RNG states (~7 KiB each, unchanged) with the counters
#: that change, re-uploading them every checkpoint.
ALONE_BYTES = 4 * 1024
#: ... into chunks of at most this many bytes.
MERGE_BYTES = 64 * 1024
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
#: Where running sweeps announce themselves (one file each; not a blob name).
SWEEPS_DIR = f"{BLOBS_DIR}/.sweeps"
#: How long an announced sweep counts as running, from its announcement.
SWEEP_LEASE_SECONDS = 900.0
#: The clock difference between machines this protocol tolerates: a writer trusts a sweep's
#: lease as over only this long after its ``expires_at``, and the sweep stops deleting this
#: long before it (on its own monotonic clock).
CLOCK_SKEW_SECONDS = 60.0
#: How long one storage request may take with all its retries (5 tries of a 60 s timeout
#: plus backoff): a sweep sends no delete later than this before its lease ends.
REQUEST_BUDGET_SECONDS = 300.0


def blob_key(sha256: str) -> str:
    """The storage key of the blob with this SHA-256 (64 lowercase hex digits)."""
    return f"{BLOBS_DIR}/{sha256[:2]}/{sha256}"


def check_chunk_bytes(chunk_bytes: Any) -> int:
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 4096:
        raise errors.InvalidConfig(
            "dedup_chunk_bytes must be an int of at least 4096 (bytes per content-addressed "
            f"chunk; 4 MiB by default). Received: {chunk_bytes!r}"
        )
    return chunk_bytes


def _read_chunks(path: str, chunk_bytes: int) -> Iterable[bytes]:
    with open(path, "rb") as f:
        while data := f.read(chunk_bytes):
            yield data


def chunk_file(path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[dict[str, Any]]:
    """``[{"sha256", "size"}, ...]`` of the fixed-size chunks of the file at ``path``."""
    return [
        {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for data in _read_chunks(path, chunk_bytes)
    ]


def cut_ranges(size: int, cuts: Iterable[int], chunk_bytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the chunks of a ``size``-byte file cut at ``cuts``: a cut
    offset starts a new piece; a piece longer than ``chunk_bytes`` is split every
    ``chunk_bytes`` from its start; consecutive pieces of at most :data:`ALONE_BYTES` are merged
    while the chunk stays within :data:`MERGE_BYTES`. Cuts outside ``(0, size)`` are ignored."""
    bounds = sorted({c for c in cuts if 0 < c < size} | {0, size})
    out: list[tuple[int, int]] = []
    run_start = run_end = -1

    def flush() -> None:
        nonlocal run_start, run_end
        if run_start >= 0:
            out.append((run_start, run_end - run_start))
        run_start = run_end = -1

    for start, end in zip(bounds, bounds[1:], strict=False):
        for offset in range(start, end, chunk_bytes):
            stop = min(end, offset + chunk_bytes)
            if end - start > ALONE_BYTES:  # a big piece (or a part of one): its own chunk
                flush()
                out.append((offset, stop - offset))
                continue
            if run_start >= 0 and stop - run_start > MERGE_BYTES:
                flush()
            if run_start < 0:
                run_start = offset
            run_end = stop
    flush()
    return out


def chunk_ranges(path: str, ranges: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """``[{"sha256", "size"}, ...]`` of the byte ranges ``(offset, length)`` of ``path``."""
    out = []
    with open(path, "rb") as f:
        fd = f.fileno()
        for offset, length in ranges:
            data = os.pread(fd, length, offset)
            if len(data) != length:
                raise errors.CheckpointError(
                    f"{path} changed while it was being chunked (short read at {offset})."
                )
            out.append({"sha256": hashlib.sha256(data).hexdigest(), "size": length})
    return out


def check_entry_blobs(entry: Mapping[str, Any], rel: str, where: str) -> None:
    """Validate the ``blobs`` list of a manifest entry (InvalidCheckpoint naming it)."""
    chunks = entry["blobs"]
    ok = isinstance(chunks, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("sha256"), str)
        and SHA_RE.match(c["sha256"]) is not None
        and isinstance(c.get("size"), int)
        and c["size"] >= 0
        for c in chunks
    )
    if not ok or sum(c["size"] for c in chunks) != entry["size"]:
        raise errors.InvalidCheckpoint(
            f"{where} has a malformed blob list for {rel!r} (expected chunks with sha256 and "
            "size adding up to the file size); the checkpoint is damaged."
        )


def referenced(manifest: Mapping[str, Any]) -> set[str]:
    """The SHA-256 of every blob a manifest (or pending marker) names."""
    if isinstance(manifest.get("blobs"), list):  # a pending marker
        return {s for s in manifest["blobs"] if isinstance(s, str)}
    found: set[str] = set()
    for entry in manifest.get("files", {}).values():
        for chunk in entry.get("blobs", ()) if isinstance(entry, dict) else ():
            if isinstance(chunk, dict) and isinstance(chunk.get("sha256"), str):
                found.add(chunk["sha256"])
    return found


def uses_blobs(manifest: Mapping[str, Any]) -> bool:
    return any("blobs" in e for e in manifest["files"].values())


# ---- writing -----------------------------------------------------------------------------------
@dataclass
class UploadStats:
    """What a deduplicated commit wrote: ``uploaded`` new bytes, ``reused`` bytes already there."""

    uploaded: int = 0
    reused: int = 0
    reused_keys: list[tuple[str, str, int, int]] = field(default_factory=list)


def plan(
    local_dir: str,
    entries: Mapping[str, Any],
    chunk_bytes: int,
    cuts: Mapping[str, Iterable[int]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Entries with their ``blobs`` lists (folders stay as they are). ``cuts`` (``{relpath:
    [offset, ...]}``, from the file's writer) cuts a file where its content's pieces begin
    and end (:func:`cut_ranges`); other files are cut every ``chunk_bytes``."""
    planned: dict[str, dict[str, Any]] = {}
    for rel, entry in entries.items():
        if rel.endswith("/"):
            planned[rel] = dict(entry)
            continue
        path = os.path.join(local_dir, *rel.split("/"))
        if cuts and cuts.get(rel):
            ranges = cut_ranges(os.path.getsize(path), cuts[rel], chunk_bytes)
            planned[rel] = dict(entry, blobs=chunk_ranges(path, ranges))
        else:
            planned[rel] = dict(entry, blobs=chunk_file(path, chunk_bytes))
    return planned


class KnownBlobs:
    """The blobs one writer believes are in storage: those its last commit named (or, before
    its first commit, those one listing found). Uploads skip asking storage about them; they
    stay in :attr:`UploadStats.reused_keys`, so :func:`recheck` still puts back any a sweep
    removed. Thread-safe (background commits may overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shas: frozenset[str] | None = None

    def get(self) -> frozenset[str] | None:
        with self._lock:
            return self._shas

    def set(self, shas: Iterable[str]) -> None:
        with self._lock:
            self._shas = frozenset(shas)


def listed(storage: Storage) -> set[str]:
    """The SHA-256 of every blob in storage (one listing of the blob folder)."""
    return {
        name
        for rel in storage.list(BLOBS_DIR)
        if SHA_RE.match(name := rel.rsplit("/", 1)[-1]) and rel == f"{name[:2]}/{name}"
    }


def upload(
    storage: Storage,
    local_dir: str,
    entries: Mapping[str, Any],
    chunk_bytes: int,
    *,
    workers: int = UPLOAD_WORKERS,
    known: Collection[str] | None = None,
) -> UploadStats:
    """Create every blob ``entries`` names that storage does not hold yet (create-only), on
    ``workers`` threads (one request per chunk, so in parallel as a multipart upload is).

    Blobs in ``known`` (believed present: :class:`KnownBlobs`) cost no request; the others
    are created with one create-only write each (a blob already there is not replaced).
    ``known=None`` lists the blob folder once instead. Every blob not created here is in
    ``reused_keys``, for :func:`recheck`."""
    if known is None:
        known = listed(storage)
    stats = UploadStats()
    todo: list[tuple[str, str, int, int]] = []
    seen: set[str] = set()
    for rel, entry in entries.items():
        if rel.endswith("/"):
            continue
        offset = 0
        for chunk in entry["blobs"]:
            sha, size = chunk["sha256"], chunk["size"]
            if sha in seen:
                stats.reused += size
            elif sha in known:
                seen.add(sha)
                stats.reused += size
                stats.reused_keys.append((rel, sha, offset, size))
            else:
                seen.add(sha)
                todo.append((rel, sha, offset, size))
            offset += size

    def one(item: tuple[str, str, int, int]) -> bool:
        rel, sha, offset, size = item
        with open(os.path.join(local_dir, *rel.split("/")), "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        return bool(storage.write_if_absent(blob_key(sha), data))

    if not todo:
        return stats
    with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
        for item, created in zip(todo, pool.map(one, todo), strict=True):
            if created:
                stats.uploaded += item[3]
            else:
                stats.reused += item[3]
                stats.reused_keys.append(item)
    return stats


def process_identity() -> dict[str, Any]:
    """``host``, ``pid`` and (on Linux) the boot id, PID namespace and ``pid_start`` of this
    process, so a process that sees the same processes can tell that it died (and its pid was
    not reused) without waiting for a lease. Containers sharing a host name but not their
    processes differ in PID namespace, so none of them judges the others."""
    ident: dict[str, Any] = {"host": os.uname().nodename, "pid": os.getpid()}
    ident.update(_pid_view())
    start = _pid_start(os.getpid())
    if start is not None:
        ident["pid_start"] = start
    return ident


def _pid_view() -> dict[str, str]:
    """Which kernel boot and PID namespace this process sees pids in ({} if unknown)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return {"boot_id": boot, "pid_ns": os.readlink("/proc/self/ns/pid")}
    except OSError:
        return {}


def _pid_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (start time in clock ticks); the command name (field 2) may hold spaces.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _dead_on_this_host(info: Mapping[str, Any]) -> bool:
    view = _pid_view()
    if (
        not view
        or info.get("host") != os.uname().nodename
        or any(info.get(k) != v for k, v in view.items())
        or not isinstance(info.get("pid"), int)
    ):
        return False  # not a process we can see: only its lease tells
    pid = info["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, someone else's
    started = info.get("pid_start")
    return started is not None and _pid_start(pid) not in (None, started)


#: Announcements this process wrote whose sweep has ended but which could not be removed
#: (storage failing): our writers do not wait for them, and our next sweep removes them.
#: Writers in other processes cannot know; they wait until the lease is over.
_ENDED_HERE: set[str] = set()
_ENDED_LOCK = threading.Lock()


def sweep_ended(name: str, *, removed: bool) -> None:
    """Record that this process's sweep ``name`` (an announcement's file name) has ended;
    ``removed`` says whether its announcement is gone from storage."""
    with _ENDED_LOCK:
        if removed:
            _ENDED_HERE.discard(name)
        else:
            _ENDED_HERE.add(name)


def ended_here(name: str) -> bool:
    """Whether announcement ``name`` is one of this process's sweeps that has ended."""
    with _ENDED_LOCK:
        return name in _ENDED_HERE


def active_sweeps(storage: Storage) -> set[str]:
    """Names of the sweep announcements in storage whose sweep may still delete: lease not
    over, and not a process we can see that is gone. Announcements are created whole
    (create-only writes), so one that cannot be parsed is damaged: it is ignored with a
    warning (the next sweep removes it)."""
    now = time.time()
    active = set()
    for rel in storage.list(SWEEPS_DIR):
        if ended_here(rel):
            continue
        try:
            info = json.loads(storage.read_bytes(f"{SWEEPS_DIR}/{rel}"))
            expires = float(info["expires_at"])
        except errors.StorageNotFound:
            continue  # that sweep just finished
        except (ValueError, TypeError, KeyError, AttributeError):
            logger.warning("Ignoring the damaged blob sweep announcement %s/%s.", SWEEPS_DIR, rel)
            continue
        if not sweep_is_over(info, expires, now):
            active.add(rel)
    return active


def sweep_is_over(info: Mapping[str, Any], expires_at: float, now: float) -> bool:
    """Whether the sweep of announcement ``info`` can no longer delete anything."""
    return now >= expires_at + CLOCK_SKEW_SECONDS or _dead_on_this_host(info)


def wait_for_sweeps(storage: Storage, *, poll_seconds: float = 0.05) -> None:
    """Block until every sweep announced now has ended (or its lease is over). A sweep that
    starts later reads references after our pending marker was written, so it keeps our blobs;
    one running now may have read them before, so we let it finish and :func:`recheck` after."""
    waiting = active_sweeps(storage)
    if waiting:
        logger.info("Waiting for %d blob sweep(s) to finish before the commit.", len(waiting))
    # Every announcement is over SWEEP_LEASE_SECONDS + CLOCK_SKEW_SECONDS after it was written
    # (by its writer's clock); waiting longer means the clocks disagree by more than we allow.
    give_up = time.monotonic() + SWEEP_LEASE_SECONDS + 2 * CLOCK_SKEW_SECONDS
    delay = poll_seconds
    while waiting:
        if time.monotonic() > give_up:
            raise errors.StorageUnavailable(
                f"Blob sweep(s) {sorted(waiting)} announced in {storage.url}/{SWEEPS_DIR} have "
                f"not ended within their lease; nothing was committed. The clocks of the "
                f"machines sharing this storage may differ by more than {CLOCK_SKEW_SECONDS:.0f} "
                "s: fix the clocks, or remove the announcement if no GC is running."
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        waiting &= active_sweeps(storage)


def recheck(
    storage: Storage, local_dir: str, stats: UploadStats, *, workers: int = UPLOAD_WORKERS
) -> int:
    """Before the commit and after :func:`wait_for_sweeps`: upload again any reused blob a
    sweep removed between our existence check and now (every one in ``reused_keys`` is
    checked, on ``workers`` threads). Returns how many."""

    def one(item: tuple[str, str, int, int]) -> bool:
        rel, sha, offset, size = item
        key = blob_key(sha)
        if storage.file_exists(key):
            return False
        with open(os.path.join(local_dir, *rel.split("/")), "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        storage.write_if_absent(key, data)
        logger.warning("Blob %s was removed while being reused; uploaded it again.", sha)
        return True

    todo = stats.reused_keys
    if not todo:
        return 0
    with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
        return sum(pool.map(one, todo))


# ---- reading -----------------------------------------------------------------------------------
def _damaged(message: str, sha: str) -> errors.ChecksumMismatch:
    exc = errors.ChecksumMismatch(message)
    exc.blob = sha  # type: ignore[attr-defined]  # lets callers name every checkpoint using it
    return exc


def read_blob(storage: Storage, chunk: Mapping[str, Any], *, verify: bool, where: str) -> bytes:
    sha = chunk["sha256"]
    try:
        data = storage.read_bytes(blob_key(sha))
    except errors.StorageNotFound:
        raise _damaged(
            f"Blob {sha} of {where} is missing from {storage.url}/{BLOBS_DIR}; the checkpoint "
            "is damaged (a blob was deleted outside ckptstore). Restore the blob or delete the "
            "checkpoint.",
            sha,
        ) from None
    if verify and (len(data) != chunk["size"] or hashlib.sha256(data).hexdigest() != sha):
        raise _damaged(
            f"Blob {sha} of {where} in {storage.url} is corrupted ({len(data)} bytes, expected "
            f"{chunk['size']} with that SHA-256); every checkpoint using it is damaged (list "
            "them with `ckptstore checkpoint verify`).",
            sha,
        )
    return data


def assemble(
    storage: Storage,
    uuid: str,
    manifest: Mapping[str, Any],
    local_dir: str,
    select: Callable[[str], bool],
    *,
    verify: bool = True,
    workers: int | None = None,
) -> dict[str, int]:
    """Write every selected deduplicated file of ``manifest`` into ``local_dir`` as an
    ordinary file, verifying each blob. Returns ``{relpath: size}``.

    Chunks are read on ``workers`` threads (default: the storage's ``concurrency``, as its
    whole-file downloads use; one request per chunk, as :func:`upload` writes them)
    and each is written at its offset into its file, created at its full size first; a
    thread holds one chunk at a time, so memory stays within ``workers`` chunks. The first
    damaged or missing chunk (in file order) is raised as :class:`~ckptstore.errors.
    ChecksumMismatch` naming it, and chunks not read yet are not read. The whole file's
    crc32c is left to the caller (:func:`~ckptstore.checkpointing.format.verify_files`)."""
    written: dict[str, int] = {}
    todo: list[tuple[str, str, Mapping[str, Any], int]] = []
    #: part file -> final name. Chunks land in a part file renamed only once all arrived, so
    #: a failed download leaves no file at its final name (a good copy there stays), as
    #: whole-file downloads do.
    parts: dict[str, str] = {}
    for rel, entry in manifest["files"].items():
        if "blobs" not in entry or not select(rel):
            continue
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        part = tmp_name(target)
        with open(part, "wb") as f:
            f.truncate(entry["size"])
        parts[part] = target
        offset = 0
        for chunk in entry["blobs"]:
            todo.append((rel, part, chunk, offset))
            offset += chunk["size"]
        written[rel] = entry["size"]
    try:
        _fetch_chunks(storage, uuid, todo, verify=verify, workers=workers)
    except BaseException:
        for part in parts:
            with contextlib.suppress(OSError):
                os.unlink(part)
        raise
    for part, target in parts.items():
        os.replace(part, target)
    return written


def _fetch_chunks(
    storage: Storage,
    uuid: str,
    todo: list[tuple[str, str, Mapping[str, Any], int]],
    *,
    verify: bool,
    workers: int | None,
) -> None:
    """Read ``(rel, path, chunk, offset)`` items in parallel, each written at its offset."""
    if not todo:
        return

    def one(item: tuple[str, str, Mapping[str, Any], int]) -> None:
        rel, target, chunk, offset = item
        data = read_blob(storage, chunk, verify=verify, where=f"{uuid}/{rel}")
        fd = os.open(target, os.O_WRONLY)
        try:
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
        finally:
            os.close(fd)

    if workers is None:
        workers = getattr(storage, "concurrency", None) or UPLOAD_WORKERS
    pool = ThreadPoolExecutor(max(1, min(workers, len(todo))))
    try:
        for future in [pool.submit(one, item) for item in todo]:
            future.result()
    finally:
        # On a failure, chunks not started yet are not read (the error is raised as is).
        pool.shutdown(wait=True, cancel_futures=True)
