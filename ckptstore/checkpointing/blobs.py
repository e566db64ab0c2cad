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
  creates every other blob with a create-only write, one request each. A belief about a
  blob GC condemned is dropped (below), so a stale belief never yields a missing blob.
- Write once on a local store: a writer that knows its file's layout before writing it
  (ckptstore's ``model.keras``) writes each chunk into its own part file in the staging folder
  (:class:`SplitFile`, under :data:`PARTS_DIR`; the file itself stays a sparse placeholder of
  its size) and the commit hard-links each new part create-only into the blob folder
  (:meth:`~ckptstore.storage_backends.base.Storage.link_if_absent`): every new byte is written
  once, by the writer. Any path that needs the whole file (stored whole, signed, a store
  elsewhere) first joins the parts into it (:func:`materialize`).
- The blob folder starts with ``.`` so no listing of checkpoints ever takes it for one.
- An in-flight upload names every blob it will reference in its pending marker *before* it
  looks for existing blobs; GC never deletes a blob a committed manifest or any pending marker
  names, and deletes only within a window on the storage's clock that writers check, so no
  writer ever waits for a collector (the protocol: :mod:`~ckptstore.checkpointing.condemned`;
  the sweep and the reverse lookup: :mod:`~ckptstore.checkpointing.blob_gc`).

Example::

    from ckptstore.checkpointing import blobs
    chunks = blobs.chunk_file("/tmp/ckpt/model.keras")   # [{"sha256", "size"}, ...]
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.clock import elapsed_clock
from ckptstore.checkpointing.direct_writes import Bounce, PartWriter
from ckptstore.checkpointing.entries import Chunk, FileEntry
from ckptstore.storage_backends.object_store import tmp_name

if TYPE_CHECKING:
    from ckptstore.checkpointing.format import Manifest
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

BLOBS_DIR = ".ckptstore-blobs"
DEFAULT_CHUNK_BYTES = 4 * 2**20
#: Threads uploading blobs of one checkpoint.
UPLOAD_WORKERS = 8
#: Threads hashing the chunks of one file (SHA-256 is CPU-bound: more threads than cores
#: only compete with training).
HASH_WORKERS = max(1, min(4, os.cpu_count() or 1))
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
#: The folder of a staging folder holding the part files of :class:`SplitFile` writes
#: (``PARTS_DIR/<relpath>/<offset:016x>-<length:x>[-<sha256>]``); never part of a checkpoint.
PARTS_DIR = ".ckptstore-parts"


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


def chunk_file(path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[dict[str, Any]]:
    """``[{"sha256", "size"}, ...]`` of the fixed-size chunks of the file at ``path``."""
    size = os.path.getsize(path)
    return chunk_ranges(
        path, [(o, min(chunk_bytes, size - o)) for o in range(0, size, chunk_bytes)]
    )


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
    """``[{"sha256", "size"}, ...]`` of the byte ranges ``(offset, length)`` of ``path``.

    Hashed on :data:`HASH_WORKERS` threads (hashlib releases the GIL): the commit of the last
    checkpoint of a run waits for this, and on a 2-core machine two threads halve it."""

    with open(path, "rb") as f:
        fd = f.fileno()
        return _hash_all([(fd, offset, length, path) for offset, length in ranges])


def _hash_all(items: Sequence[tuple[int, int, int, str]]) -> list[dict[str, Any]]:
    """``[{"sha256", "size"}, ...]`` of ``(fd, offset, length, name)`` byte ranges."""

    def one(item: tuple[int, int, int, str]) -> dict[str, Any]:
        fd, offset, length, name = item
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise errors.CheckpointError(
                f"{name} changed while it was being chunked (short read at {offset})."
            )
        return {"sha256": hashlib.sha256(data).hexdigest(), "size": length}

    if len(items) < 2:
        return [one(item) for item in items]
    with ThreadPoolExecutor(min(HASH_WORKERS, len(items))) as pool:
        return list(pool.map(one, items))


def chunk_parts(parts: Sequence[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """``[{"sha256", "size"}, ...]`` of the part files ``(offset, length, path)`` of a
    :class:`SplitFile` (each part is one chunk). A part whose name carries its SHA-256 (hashed
    by the writer as it wrote it, or a link to that blob) is not read again."""
    named = {p: _named_sha(p) for _, _, p in parts}
    todo = [(n, p) for _, n, p in parts if named[p] is None]
    fds = [os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) for _, path in todo]
    try:
        hashed = iter(_hash_all([(fd, 0, n, p) for fd, (n, p) in zip(fds, todo, strict=True)]))
    finally:
        for fd in fds:
            os.close(fd)
    return [
        {"sha256": named[p], "size": n} if named[p] is not None else next(hashed)
        for _, n, p in parts
    ]


def _named_sha(part: str) -> str | None:
    sha = os.path.basename(part).split("-")[2:]
    return sha[0] if sha and SHA_RE.match(sha[0]) else None


class SplitFile:
    """Write the ``size``-byte file ``relpath`` of staging folder ``local_dir`` as one part
    file per chunk ``ranges`` (``(offset, length)``, from :func:`cut_ranges`), so a local
    deduplicated commit links new chunks into the blob folder instead of copying them.
    :meth:`pwrite` takes writes at any offset (a write across chunks is split);
    :meth:`close` leaves the file itself as a placeholder of its size with no bytes.

    A chunk written in file order is hashed (SHA-256) as it is written, while its bytes are
    in the CPU cache, and its part named with the digest (the commit does not read it again).
    :meth:`link_blob` takes a chunk the writer knows is unchanged from the stored blob of
    ``blob_dir`` (a hard link: no byte written, none hashed). A part written in order goes to
    the disk past the page cache where the file system allows
    (:class:`~ckptstore.checkpointing.direct_writes.PartWriter`: the writer's CPU per byte
    falls ~4x; a resume then reads it from the disk, not from memory).

    Example::

        out = SplitFile(staging, "model.keras", size, cut_ranges(size, cuts, chunk_bytes))
        out.pwrite(data, offset)
        out.close()
    """

    def __init__(
        self,
        local_dir: str,
        relpath: str,
        size: int,
        ranges: Sequence[tuple[int, int]],
        blob_dir: str | None = None,
    ) -> None:
        self.path = os.path.join(local_dir, *relpath.split("/"))
        self.size = size
        self.blob_dir = blob_dir
        self._folder = os.path.join(local_dir, PARTS_DIR, *relpath.split("/"))
        os.makedirs(self._folder)
        self._ranges = list(ranges)
        self._starts = [offset for offset, _ in self._ranges]
        #: (range index, its writer): writes come mostly in file order, one part at a time.
        self._open: tuple[int, PartWriter] | None = None
        self._bounce = Bounce()
        #: range index -> (SHA-256 so far, bytes hashed), while its writes come in order.
        self._hashing: dict[int, tuple[Any, int] | None] = {}
        #: range index -> SHA-256 of the chunks complete (hashed or linked).
        self.digests: dict[int, str] = {}

    def covering(self, start: int, end: int) -> list[int] | None:
        """The indices of the chunks that exactly tile ``[start, end)``, or None."""
        i = bisect.bisect_left(self._starts, start)
        found: list[int] = []
        while i < len(self._ranges) and self._starts[i] == start and start < end:
            found.append(i)
            start += self._ranges[i][1]
            i += 1
        return found if found and start == end else None

    def range(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of chunk ``index``."""
        return self._ranges[index]

    def _name(self, index: int, sha: str | None = None) -> str:
        offset, length = self._ranges[index]
        tail = f"-{sha}" if sha else ""
        return os.path.join(self._folder, f"{offset:016x}-{length:x}{tail}")

    def _part(self, index: int) -> PartWriter:
        if self._open is None or self._open[0] != index:
            self._close_open()
            self._open = (
                index,
                PartWriter(self._name(index), self._bounce, self._ranges[index][1]),
            )
        return self._open[1]

    def _close_open(self) -> None:
        if self._open is not None:
            open_, self._open = self._open, None
            open_[1].close()

    def _hash(self, index: int, view: memoryview, at: int) -> None:
        state = self._hashing.get(index, (hashlib.sha256(), 0) if at == 0 else None)
        if state is None or state[1] != at:  # out of order: the commit hashes the part
            self._hashing[index] = None
            return
        state[0].update(view)
        done = at + len(view)
        self._hashing[index] = (state[0], done)
        if done == self._ranges[index][1]:
            sha = state[0].hexdigest()
            if self._open is not None and self._open[0] == index:
                self._close_open()
            os.rename(self._name(index), self._name(index, sha))
            self.digests[index] = sha

    def link_blob(self, index: int, sha: str) -> bool:
        """Take chunk ``index`` from the stored blob ``sha`` (a hard link into the parts, so
        the bytes stay ours even if GC deletes the blob before the commit names it). False:
        nothing was done (no blob there, links impossible); write the chunk instead."""
        if self.blob_dir is None or index in self._hashing:
            return False
        try:
            os.link(os.path.join(self.blob_dir, sha[:2], sha), self._name(index, sha))
        except OSError:
            return False
        self._hashing[index] = None
        self.digests[index] = sha
        return True

    def pwrite(self, data: Any, offset: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            index = bisect.bisect_right(self._starts, offset) - 1
            start, length = self._ranges[max(index, 0)]
            take = min(len(view), start + length - offset)
            if index < 0 or take <= 0:
                raise ValueError(f"write at {offset} outside the {self.size}-byte file")
            if index in self.digests:
                raise ValueError(f"write at {offset} into a chunk already complete")
            self._part(index).pwrite(view[:take], offset - start)
            self._hash(index, view[:take], offset - start)
            view = view[take:]
            offset += take

    def close(self) -> None:
        self._close_open()
        with open(self.path, "wb") as f:
            f.truncate(self.size)  # a sparse placeholder: its size for the folder's listing

    def abort(self) -> None:
        self._close_open()
        shutil.rmtree(self._folder, ignore_errors=True)


def split_files(local_dir: str) -> dict[str, list[tuple[int, int, str]]]:
    """``{relpath: [(offset, length, part path), ...]}`` of the :class:`SplitFile` writes in
    staging folder ``local_dir`` (empty when there are none)."""
    top = os.path.join(local_dir, PARTS_DIR)
    found: dict[str, list[tuple[int, int, str]]] = {}
    for root, _dirs, names in os.walk(top):
        rel = os.path.relpath(root, top).replace(os.sep, "/")
        for name in names:
            offset, length = name.split("-")[:2]  # a third field: the part's SHA-256
            found.setdefault(rel, []).append(
                (int(offset, 16), int(length, 16), os.path.join(root, name))
            )
    return {rel: sorted(parts) for rel, parts in found.items()}


def materialize(local_dir: str, relpaths: Iterable[str] | None = None) -> None:
    """Join the parts of the :class:`SplitFile` writes in ``local_dir`` (those of
    ``relpaths``, default all) into their files, for a path that stores or reads the whole
    file; the parts are removed."""
    from ckptstore.storage_backends.local import copy_range

    split = split_files(local_dir)
    for rel in split if relpaths is None else [r for r in relpaths if r in split]:
        with open(os.path.join(local_dir, *rel.split("/")), "r+b") as dst:
            for offset, length, part in split[rel]:
                with open(part, "rb") as src:
                    if copy_range(src.fileno(), dst.fileno(), length, 0, offset) != length:
                        raise errors.CheckpointError(f"{part} is shorter than {length} bytes.")
        shutil.rmtree(os.path.join(local_dir, PARTS_DIR, *rel.split("/")))
    if os.path.isdir(os.path.join(local_dir, PARTS_DIR)) and not split_files(local_dir):
        shutil.rmtree(os.path.join(local_dir, PARTS_DIR), ignore_errors=True)


# ---- a manifest entry's chunks (the rule every reader of a format-2 entry uses) -------------
def is_chunked(entry: FileEntry | Mapping[str, Any]) -> bool:
    """True when a manifest entry's file is stored as chunks (a list, maybe empty), not whole
    (a :class:`FileEntry`, or a writer's planned entry in its JSON shape)."""
    return entry.chunked if isinstance(entry, FileEntry) else "blobs" in entry


def chunks_of(entry: FileEntry | Mapping[str, Any]) -> Sequence[Chunk]:
    """The chunks (in order) of a manifest entry; none if whole."""
    return FileEntry.of(entry).chunks or ()


def chunk_shas(entries: Mapping[str, FileEntry | Mapping[str, Any]]) -> set[str]:
    """The SHA-256 of every chunk manifest entries name (a writer's planned entries too)."""
    return {c.sha256 for e in entries.values() for c in chunks_of(e)}


def marker_blobs(marker: object) -> set[str]:
    """The SHA-256 of every blob a pending marker's JSON names (nothing for a bad one)."""
    named = marker.get("blobs") if isinstance(marker, dict) else None
    return {s for s in named if isinstance(s, str)} if isinstance(named, list) else set()


# ---- writing -----------------------------------------------------------------------------------
@dataclass
class UploadStats:
    """What a deduplicated commit wrote: ``uploaded`` new bytes, ``reused`` bytes already there."""

    uploaded: int = 0
    reused: int = 0


def plan(
    local_dir: str,
    entries: Mapping[str, Any],
    chunk_bytes: int,
    cuts: Mapping[str, Iterable[int]] | None = None,
    whole: Callable[[str], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Entries with their ``blobs`` lists (folders, and files ``whole`` picks, stay as they
    are: stored whole in the checkpoint folder). ``cuts`` (``{relpath: [offset, ...]}``, from
    the file's writer) cuts a file where its content's pieces begin and end
    (:func:`cut_ranges`); other files are cut every ``chunk_bytes``."""
    planned: dict[str, dict[str, Any]] = {}
    split = split_files(local_dir)
    for rel, entry in entries.items():
        if rel.endswith("/") or (whole is not None and whole(rel)):
            materialize(local_dir, [rel])
            planned[rel] = dict(entry)
            continue
        path = os.path.join(local_dir, *rel.split("/"))
        if rel in split:  # written as its chunks (SplitFile): each part is one
            planned[rel] = dict(entry, blobs=chunk_parts(split[rel]))
        elif cuts and cuts.get(rel):
            ranges = cut_ranges(os.path.getsize(path), cuts[rel], chunk_bytes)
            planned[rel] = dict(entry, blobs=chunk_ranges(path, ranges))
        else:
            planned[rel] = dict(entry, blobs=chunk_file(path, chunk_bytes))
    return planned


class KnownBlobs:
    """The blobs one writer believes are in storage: those its last commit named (or, before
    its first commit, those one listing found). Uploads skip asking storage about them; they
    are dropped from it when GC condemned them (:mod:`.condemned`). A belief older than :data:`MAX_AGE_SECONDS` is dropped: GC removes
    a condemnation's file an hour after its deletes, and a writer must not rely on blobs
    whose removal it can no longer see. Thread-safe (background commits may overlap)."""

    #: Half of :data:`~ckptstore.checkpointing.condemned.KEEP_SPENT_SECONDS`.
    MAX_AGE_SECONDS = 1800.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shas: frozenset[str] | None = None
        self._since = 0.0

    def get(self) -> frozenset[str] | None:
        with self._lock:
            if elapsed_clock() - self._since > self.MAX_AGE_SECONDS:
                return None
            return self._shas

    def set(self, shas: Iterable[str], since: float | None = None) -> None:
        """Believe ``shas`` are stored, as checked at ``since`` (:func:`~ckptstore.
        checkpointing.clock.elapsed_clock`, which counts time asleep; default now)."""
        with self._lock:
            self._shas = frozenset(shas)
            self._since = elapsed_clock() if since is None else since


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
    ``known=None`` lists the blob folder once instead."""
    if known is None:
        known = listed(storage)
    stats = UploadStats()
    todo: list[tuple[str, str, int, int]] = []
    seen: set[str] = set()
    for rel, entry in entries.items():
        if rel.endswith("/"):
            continue
        offset = 0
        for chunk in chunks_of(entry):  # a file stored whole has none
            sha, size = chunk.sha256, chunk.size
            if sha in seen:
                stats.reused += size
            elif sha in known:
                seen.add(sha)
                stats.reused += size
            else:
                seen.add(sha)
                todo.append((rel, sha, offset, size))
            offset += size

    parts = {
        (rel, o): path for rel, found in split_files(local_dir).items() for o, _, path in found
    }

    def one(item: tuple[str, str, int, int]) -> bool:
        rel, sha, offset, size = item
        part = parts.get((rel, offset))
        if part is not None:  # the writer's own copy of the chunk: linked, not copied
            return bool(storage.link_if_absent(blob_key(sha), part, durable=False))
        path = os.path.join(local_dir, *rel.split("/"))
        return bool(storage.write_range_if_absent(blob_key(sha), path, offset, size, durable=False))

    if not todo:
        return stats
    with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
        for item, created in zip(todo, pool.map(one, todo), strict=True):
            if created:
                stats.uploaded += item[3]
            else:
                stats.reused += item[3]
    return stats


# ---- reading -----------------------------------------------------------------------------------
#: ``place(chunk, fd, offset, where)``: write a chunk's verified bytes at ``offset`` of the open
#: file ``fd``; ``where`` names the chunk in errors.
ChunkPlacer = Callable[[Chunk, int, int, str], None]


def _damaged(message: str, sha: str) -> errors.ChecksumMismatch:
    exc = errors.ChecksumMismatch(message)
    exc.blob = sha  # type: ignore[attr-defined]  # lets callers name every checkpoint using it
    return exc


def read_blob(storage: Storage, chunk: Chunk, *, verify: bool, where: str) -> bytes:
    try:
        data = storage.read_bytes(blob_key(chunk.sha256))
    except errors.StorageNotFound:
        raise _missing(storage, chunk, where) from None
    if verify:
        _check_blob(storage, chunk, where, data)
    return data


def place_blob(
    storage: Storage, chunk: Chunk, fd: int, offset: int, *, verify: bool, where: str
) -> None:
    """Write a chunk at ``offset`` of the open file ``fd``, checked first (as :func:`read_blob`);
    a local store copies it in the kernel (:meth:`~ckptstore.storage_backends.base.Storage.
    read_into`)."""
    check = _BlobCheck(storage, chunk, where) if verify else None
    try:
        storage.read_into(blob_key(chunk.sha256), fd, offset, check)
    except errors.StorageNotFound:
        raise _missing(storage, chunk, where) from None


def _missing(storage: Storage, chunk: Chunk, where: str) -> errors.ChecksumMismatch:
    sha = chunk.sha256
    return _damaged(
        f"Blob {sha} of {where} is missing from {storage.url}/{BLOBS_DIR}; the checkpoint "
        "is damaged (a blob was deleted outside ckptstore). Restore the blob or delete the "
        "checkpoint.",
        sha,
    )


def _check_blob(storage: Storage, chunk: Chunk, where: str, data: bytes) -> None:
    _check_sums(storage, chunk, where, len(data), lambda: hashlib.sha256(data).hexdigest())


def _check_sums(
    storage: Storage, chunk: Chunk, where: str, size: int, digest: Callable[[], str]
) -> None:
    """Raise unless ``size`` bytes whose SHA-256 is ``digest()`` are the chunk."""
    sha = chunk.sha256
    if size != chunk.size or digest() != sha:
        raise _damaged(
            f"Blob {sha} of {where} in {storage.url} is corrupted ({size} bytes, expected "
            f"{chunk.size} with that SHA-256); every checkpoint using it is damaged (list "
            "them with `ckptstore checkpoint verify`).",
            sha,
        )


class _BlobCheck:
    """A chunk's check, on its whole bytes (``check(data)``) or piece by piece as a streamed
    read delivers them (``reset()`` per attempt, ``update(piece)``, ``finish()``: see
    :meth:`~ckptstore.storage_backends.object_store.ObjectStorage.read_into`)."""

    def __init__(self, storage: Storage, chunk: Chunk, where: str) -> None:
        self.storage, self.chunk, self.where = storage, chunk, where
        self.reset()

    def __call__(self, data: bytes) -> None:
        _check_blob(self.storage, self.chunk, self.where, data)

    def reset(self) -> None:
        self.sha, self.size = hashlib.sha256(), 0

    def update(self, piece: bytes) -> None:
        self.sha.update(piece)
        self.size += len(piece)

    def finish(self) -> None:
        _check_sums(self.storage, self.chunk, self.where, self.size, self.sha.hexdigest)


def assemble(
    storage: Storage,
    uuid: str,
    manifest: Manifest,
    local_dir: str,
    select: Callable[[str], bool],
    *,
    verify: bool = True,
    workers: int | None = None,
    place: ChunkPlacer | None = None,
) -> dict[str, int]:
    """Write every selected deduplicated file of ``manifest`` into ``local_dir`` as an
    ordinary file, verifying each blob. Returns ``{relpath: size}``.

    Chunks are read on ``workers`` threads (default: the storage's ``concurrency``, as its
    whole-file downloads use; one request per chunk, as :func:`upload` writes them)
    and each is written at its offset into its file, created at its full size first; a
    thread holds one chunk at a time, so memory stays within ``workers`` chunks. The first
    damaged or missing chunk (in file order) is raised as :class:`~ckptstore.errors.
    ChecksumMismatch` naming it, and chunks not read yet are not read. The whole file's
    crc32c is left to the caller (:func:`~ckptstore.checkpointing.format.verify_files`).
    ``place(chunk, fd, offset, where)`` writes a chunk's verified bytes (default:
    :func:`place_blob` from ``storage``; the restore's cache passes its own)."""
    written: dict[str, int] = {}
    todo: list[tuple[str, str, Chunk, int]] = []
    #: part file -> final name. Chunks land in a part file renamed only once all arrived, so
    #: a failed download leaves no file at its final name (a good copy there stays), as
    #: whole-file downloads do.
    parts: dict[str, str] = {}
    for rel, entry in manifest.files.items():
        if not is_chunked(entry) or not select(rel):
            continue
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        part = tmp_name(target)
        with open(part, "wb") as f:
            f.truncate(entry.size)
        parts[part] = target
        offset = 0
        for chunk in chunks_of(entry):
            todo.append((rel, part, chunk, offset))
            offset += chunk.size
        written[rel] = entry.size
    try:
        if place is None:
            place = lambda chunk, fd, offset, where: place_blob(  # noqa: E731
                storage, chunk, fd, offset, verify=verify, where=where
            )
        if workers is None:
            workers = getattr(storage, "concurrency", None) or UPLOAD_WORKERS
        _fetch_chunks(uuid, todo, place, workers)
    except BaseException:
        for part in parts:
            with contextlib.suppress(OSError):
                os.unlink(part)
        raise
    for part, target in parts.items():
        os.replace(part, target)
    return written


def _fetch_chunks(
    uuid: str,
    todo: list[tuple[str, str, Chunk, int]],
    place: ChunkPlacer,
    workers: int,
) -> None:
    """Place ``(rel, path, chunk, offset)`` items in parallel, each at its offset."""
    if not todo:
        return

    def one(item: tuple[str, str, Chunk, int]) -> None:
        rel, target, chunk, offset = item
        fd = os.open(target, os.O_WRONLY)
        try:
            place(chunk, fd, offset, f"{uuid}/{rel}")
        finally:
            os.close(fd)

    pool = ThreadPoolExecutor(max(1, min(workers, len(todo))))
    try:
        for future in [pool.submit(one, item) for item in todo]:
            future.result()
    finally:
        # On a failure, chunks not started yet are not read (the error is raised as is).
        pool.shutdown(wait=True, cancel_futures=True)
