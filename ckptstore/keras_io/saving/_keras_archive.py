"""Write a standard ``.keras`` zip in ONE pass over the weights, with its checksums.

Keras's ``model.save()`` (and a naive background writer) passes over the model state several
times: copy the variables to NumPy, write HDF5 into a buffer or a temporary file, copy that into
the zip while computing the zip's CRC-32, and ckptstore then reads the result again for the
manifest's CRC-32C. Here each large array is touched once, in chunks small enough to stay in
the CPU cache: the chunk is written straight to its final place in the zip file, and both
checksums are computed on it while it is still in the cache.

How: h5py lays out ``model.weights.h5`` (groups, attributes, dataset headers) in an in-memory
sparse file, with the storage of every large dataset allocated but never written (HDF5's early
allocation, no fill). HDF5 then reports where each dataset's bytes live, so the zip writer copies
HDF5's small metadata blocks from the sparse file and each array's bytes from the array itself,
in file order. The zip is stored (not compressed), exactly as Keras writes it, so
``keras.models.load_model`` and any zip tool read it; the local header of the weights entry is
written last, once its CRC-32 is known, and the CRC-32C of the whole file is put together from the
CRC-32C of its pieces (:func:`~ckptstore.checkpointing.checksums.crc32c_combine`).

The weights entry comes first and its bytes start at offset :data:`WEIGHTS_DATA_OFFSET` (its
local header is padded with an alignment extra field, as Android's zipalign does): HDF5 looks
for its superblock at 0, 512, 1024, ... and reads a file found there as one with a user block,
so h5py (and ``model.load_weights`` given a ``*.weights.h5`` link to the archive) reads the
weights straight from the ``.keras`` file, at the speed of a plain ``.weights.h5`` and without
Keras's zip reader (~10x slower for large models) or an extracted copy.

Example::

    entries = [("dense/vars", {"name": "dense"}, [("0", kernel), ("1", bias)])]
    size, crc32c = write_archive("/tmp/m.keras", entries, config_json="{...}")
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import struct
import time
import zlib
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from ckptstore.checkpointing import blobs
from ckptstore.checkpointing import checksums as fast_crc

CONFIG_NAME = "config.json"
METADATA_NAME = "metadata.json"
WEIGHTS_NAME = "model.weights.h5"
ASSETS_DIR = "assets"

#: Arrays at least this large are written by us, straight from memory; smaller ones by h5py.
DIRECT_MIN_BYTES = 64 * 1024
#: Bytes handled per write/checksum step (fits the CPU's L2 cache).
CHUNK_BYTES = 1 << 20
_PAGE = 64 * 1024
_ZIP64_LIMIT = (1 << 31) - 1  # the limit Python's zipfile uses
#: Where the bytes of ``model.weights.h5`` begin: the first place HDF5 looks for a superblock
#: after the start of a file.
WEIGHTS_DATA_OFFSET = 512
_ALIGN_EXTRA_ID = 0xD935  # the ID zipalign gives its padding field; zip readers skip it
_U32_MAX = 0xFFFFFFFF


@dataclasses.dataclass
class WeightGroup:
    """One HDF5 group of ``model.weights.h5``: its path, ``name`` attribute and datasets."""

    path: str
    attrs: dict[str, Any] | None
    datasets: list[tuple[str, Any]]


@dataclasses.dataclass
class _Held:
    """A large array of the last archive a :class:`WriteMemo` saw, with its checksums."""

    #: Held, so its buffer is never freed and reused: TensorFlow copies a buffer that another
    #: holder shares before changing it, so while held, the same address means the same bytes.
    array: np.ndarray
    crc32: int
    crc32c: int
    #: SHA-256 of its chunks (their blobs), in file order.
    shas: list[str]


class WriteMemo:
    """What one writer's last archive knew of its frozen arrays (those ``write_archive`` was
    told it may hold): a later archive that finds the same buffer at the same place takes
    its chunks from the blobs already stored (:meth:`~ckptstore.checkpointing.blobs.
    SplitFile.link_blob`) and its checksums from here, writing and hashing none of its bytes
    (a frozen backbone costs nothing per checkpoint). Used by one thread at a time.

    Example::

        memo = WriteMemo()
        write_archive(path, groups, config_json="{}", split=4 << 20, memo=memo, hold={...})
    """

    def __init__(self) -> None:
        self.held: dict[int, _Held] = {}
        #: Bytes taken from stored blobs instead of written (all archives so far).
        self.reused_bytes = 0


def _same_buffer(held: np.ndarray, array: Any) -> bool:
    return (
        isinstance(array, np.ndarray)
        and array.flags.c_contiguous
        and held.__array_interface__["data"][0] == array.__array_interface__["data"][0]
        and held.nbytes == array.nbytes
        and held.dtype == array.dtype
    )


class _SparseFile:
    """A file-like object for h5py that keeps only the bytes written to it, in 64 KiB pages.

    Regions never written (the storage of large datasets) cost no memory and read as zeros.
    """

    def __init__(self) -> None:
        self._pages: dict[int, bytearray] = {}
        self._pos = 0
        self.size = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._pos
        elif whence == os.SEEK_END:
            offset += self.size
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        done = 0
        while done < n:
            page, start = divmod(self._pos + done, _PAGE)
            take = min(_PAGE - start, n - done)
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = bytearray(_PAGE)
            buf[start : start + take] = view[done : done + take]
            done += take
        self._pos += n
        self.size = max(self.size, self._pos)
        return n

    def read_range(self, start: int, end: int) -> bytes:
        """The bytes in ``[start, end)`` (zeros where nothing was written)."""
        end = min(end, self.size)
        out = bytearray(max(0, end - start))
        pos = start
        while pos < end:
            page, offset = divmod(pos, _PAGE)
            take = min(_PAGE - offset, end - pos)
            buf = self._pages.get(page)
            if buf is not None:
                out[pos - start : pos - start + take] = buf[offset : offset + take]
            pos += take
        return bytes(out)

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.read_range(self._pos, self._pos + len(view))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else self._pos + n
        data = self.read_range(self._pos, end)
        self._pos += len(data)
        return data

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        for page in [p for p in self._pages if p * _PAGE >= size]:
            del self._pages[page]
        if size < self.size:
            page, offset = divmod(size, _PAGE)
            buf = self._pages.get(page)
            if buf is not None:
                buf[offset:] = bytes(_PAGE - offset)
        self.size = size
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _direct(array: np.ndarray) -> bool:
    """Whether ``array``'s bytes can be written by us: plain numbers, native byte order."""
    return (
        array.nbytes >= DIRECT_MIN_BYTES
        and array.dtype.kind in "fiu"
        and array.dtype.isnative
        and array.dtype.name != "bfloat16"
    )


def _layout_weights(
    groups: Sequence[WeightGroup], spans: list[tuple[int, int]] | None = None
) -> tuple[_SparseFile, list[tuple[int, Any]]]:
    """HDF5 metadata in a sparse file, plus ``(offset, array)`` of every directly written array.
    ``spans`` (if given) receives ``(offset, length)`` of every dataset's bytes in the file."""
    import h5py

    sparse = _SparseFile()
    direct: list[tuple[int, Any]] = []
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    with h5py.File(sparse, "w") as h5:
        for group_spec in groups:
            group = h5.create_group(group_spec.path)
            for key, value in (group_spec.attrs or {}).items():
                group.attrs[key] = value
            for key, array in group_spec.datasets:
                if not _direct(array):
                    ds = group.create_dataset(key, data=array)
                    if array.dtype.name == "bfloat16":
                        ds.attrs["dtype"] = "bfloat16"
                    _note_span(ds, spans)
                    continue
                ds = group.create_dataset(key, shape=array.shape, dtype=array.dtype, dcpl=dcpl)
                offset = ds.id.get_offset()
                if offset is None or ds.id.get_storage_size() != array.nbytes:
                    ds[...] = array  # not laid out as expected: let HDF5 write it
                    _note_span(ds, spans)
                    continue
                direct.append((int(offset), array))
                if spans is not None:
                    spans.append((int(offset), int(array.nbytes)))
    direct.sort(key=lambda item: item[0])
    end = 0
    for offset, array in direct:
        if offset < end:
            raise RuntimeError("HDF5 placed two datasets over each other; cannot write directly.")
        end = offset + array.nbytes
    sparse.size = max(sparse.size, end)
    return sparse, direct


def _note_span(ds: Any, spans: list[tuple[int, int]] | None) -> None:
    """Record where the bytes of dataset ``ds`` are (contiguous storage only)."""
    if spans is None:
        return
    offset = ds.id.get_offset()
    size = ds.id.get_storage_size()
    if offset is not None and size:
        spans.append((int(offset), int(size)))


def _dos_time(stamp: tuple[int, ...]) -> tuple[int, int]:
    year, month, day, hour, minute, second = stamp[:6]
    return (hour << 11) | (minute << 5) | (second // 2), ((year - 1980) << 9) | (month << 5) | day


@dataclasses.dataclass
class _ZipEntry:
    name: bytes
    offset: int
    size: int
    crc32: int
    stamp: tuple[int, ...]

    @property
    def zip64(self) -> bool:
        return self.size > _ZIP64_LIMIT

    def local_header(self, data_at: int | None = None) -> bytes:
        """The local header; with ``data_at``, padded so the entry's data starts there."""
        dostime, dosdate = _dos_time(self.stamp)
        extra = b""
        size = self.size
        if self.zip64:
            extra = struct.pack("<HHQQ", 1, 16, size, size)
            size = _U32_MAX
        if data_at is not None:
            pad = data_at - self.offset - 30 - len(self.name) - len(extra) - 4
            if pad < 0:
                raise ValueError(f"a local header cannot end at {data_at}")
            extra += struct.pack("<HH", _ALIGN_EXTRA_ID, pad) + bytes(pad)
        version = 45 if self.zip64 else 20
        header = struct.pack(
            "<4s2B4HL2L2H",
            b"PK\x03\x04",
            version,
            0,
            0,  # flags
            0,  # stored
            dostime,
            dosdate,
            self.crc32,
            size,
            size,
            len(self.name),
            len(extra),
        )
        return header + self.name + extra

    def central_header(self) -> bytes:
        dostime, dosdate = _dos_time(self.stamp)
        fields: list[int] = []
        size, offset = self.size, self.offset
        if self.zip64:
            fields += [size, size]
            size = _U32_MAX
        if offset > _ZIP64_LIMIT:
            fields.append(offset)
            offset = _U32_MAX
        extra = struct.pack(f"<HH{len(fields)}Q", 1, 8 * len(fields), *fields) if fields else b""
        version = 45 if extra else 20
        header = struct.pack(
            "<4s4B4HL2L5H2L",
            b"PK\x01\x02",
            version,
            3,  # made on unix
            version,
            0,
            0,
            0,
            dostime,
            dosdate,
            self.crc32,
            size,
            size,
            len(self.name),
            len(extra),
            0,
            0,
            0,
            0o600 << 16,  # -rw-------, as zipfile.writestr
            offset,
        )
        return header + self.name + extra


def _end_records(entries: list[_ZipEntry], cd_offset: int, cd_size: int) -> bytes:
    count = len(entries)
    out = b""
    if count >= 0xFFFF or cd_offset > _ZIP64_LIMIT or cd_size > _ZIP64_LIMIT:
        zip64_end = cd_offset + cd_size
        out += struct.pack(
            "<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_offset
        )
        out += struct.pack("<4sLQL", b"PK\x06\x07", 0, zip64_end, 1)
    out += struct.pack(
        "<4s4H2LH",
        b"PK\x05\x06",
        0,
        0,
        min(count, 0xFFFF),
        min(count, 0xFFFF),
        min(cd_size, _U32_MAX),
        min(cd_offset, _U32_MAX),
        0,
    )
    return out


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _byte_view(array: Any) -> np.ndarray:
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8)


def write_archive(
    path: str,
    groups: Sequence[WeightGroup],
    *,
    config_json: str,
    assets: Iterable[tuple[str, str]] = (),
    cuts: list[int] | None = None,
    split: int | None = None,
    blob_dir: str | None = None,
    memo: WriteMemo | None = None,
    hold: Collection[int] = (),
) -> tuple[int, str]:
    """Write a ``.keras`` zip at ``path``; returns ``(size in bytes, CRC-32C as 8 hex digits)``.

    ``groups`` describe ``model.weights.h5`` (arrays must not change until this returns);
    ``assets`` are ``(name inside assets/, local file)`` pairs. ``cuts`` (a list, if given)
    receives the sorted file offsets where a piece of content begins or ends: each zip entry,
    its data, and each tensor's bytes inside ``model.weights.h5`` (so a deduplicated upload
    can cut its chunks there, see :func:`ckptstore.checkpointing.blobs.cut_ranges`).
    ``split`` (a chunk size in bytes): write the file as its chunks, each in its own part file
    (:class:`ckptstore.checkpointing.blobs.SplitFile`), for a local deduplicated commit that
    links them into its blob folder; ``path`` is then a placeholder. With ``split``,
    ``blob_dir`` (the store's local blob folder) and ``memo``, the arrays whose ``id()`` is in
    ``hold`` are remembered, and an unchanged one is taken from its stored blobs next time
    (:class:`WriteMemo`).
    """
    spans: list[tuple[int, int]] | None = [] if cuts is not None or split else None
    sparse, direct = _layout_weights(groups, spans)
    h5_size = sparse.size
    entries, members = _zip_entries(h5_size, config_json, assets)
    end = WEIGHTS_DATA_OFFSET + h5_size
    # Every length is known before any byte is written (a CRC changes no length): the cuts,
    # and with them the chunks a split file is written as.
    members_bytes = b"".join(
        e.local_header() + d for e, d in zip(entries[1:], members, strict=True)
    )
    cd_offset = end + len(members_bytes)
    size = cd_offset + len(_central(entries, cd_offset))
    offsets = _cut_offsets(entries, spans or [], WEIGHTS_DATA_OFFSET, cd_offset)
    if cuts is not None:
        cuts.extend(offsets)
    out = _open_out(path, size, offsets, split, blob_dir)
    try:
        weights = entries[0]
        memo = memo if isinstance(out, blobs.SplitFile) else None
        weights.crc32, crc32c = _write_weights(
            out, sparse, direct, WEIGHTS_DATA_OFFSET, _Memo(memo, set(hold))
        )
        prefix = weights.local_header(WEIGHTS_DATA_OFFSET)
        out.pwrite(prefix, 0)
        trailer = members_bytes + _central(entries, cd_offset)
        out.pwrite(trailer, end)
    except BaseException:
        out.abort()
        raise
    out.close()
    total = fast_crc.crc32c_update(0, bytes(prefix))
    total = fast_crc.crc32c_combine(total, crc32c, h5_size)
    total = fast_crc.crc32c_combine(total, fast_crc.crc32c_update(0, bytes(trailer)), len(trailer))
    return size, f"{total:08x}"


def _zip_entries(
    h5_size: int, config_json: str, assets: Iterable[tuple[str, str]]
) -> tuple[list[_ZipEntry], list[bytes]]:
    """The zip's entries (the weights first, its CRC-32 still 0) and the other members' bytes."""
    import keras

    stamp = time.localtime()[:6]
    metadata = json.dumps(
        {
            "keras_version": keras.__version__,
            "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
        }
    ).encode()
    # The weights first, their bytes at WEIGHTS_DATA_OFFSET (see the module's docstring).
    entries = [_ZipEntry(WEIGHTS_NAME.encode(), 0, h5_size, 0, stamp)]
    named = [(METADATA_NAME, metadata), (CONFIG_NAME, config_json.encode())]
    for name, local in assets:
        with open(local, "rb") as f:
            named.append((f"{ASSETS_DIR}/{name}", f.read()))
    offset = WEIGHTS_DATA_OFFSET + h5_size
    for name, data in named:
        entry = _ZipEntry(name.encode(), offset, len(data), zlib.crc32(data), stamp)
        entries.append(entry)
        offset += len(entry.local_header()) + len(data)
    return entries, [data for _, data in named]


def _central(entries: list[_ZipEntry], cd_offset: int) -> bytes:
    central = b"".join(e.central_header() for e in entries)
    return central + _end_records(entries, cd_offset, len(central))


class _FileOut:
    """Positioned writes into one new file (what :class:`~ckptstore.checkpointing.blobs.
    SplitFile` does into its parts)."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(path, flags, 0o666)

    def pwrite(self, data: Any, offset: int) -> None:
        _pwrite_all(self.fd, data, offset)

    def close(self) -> None:
        os.close(self.fd)

    abort = close


def _open_out(
    path: str, size: int, offsets: list[int], split: int | None, blob_dir: str | None
) -> Any:
    if not split:
        return _FileOut(path)
    folder, name = os.path.split(path)
    ranges = blobs.cut_ranges(size, offsets, split)
    return blobs.SplitFile(folder, name, size, ranges, blob_dir=blob_dir)


def _write_weights(
    out: Any, sparse: _SparseFile, direct: list[tuple[int, Any]], data_start: int, memo: _Memo
) -> tuple[int, int]:
    """Write ``model.weights.h5`` at ``data_start``: the HDF5 metadata from ``sparse`` and each
    large array straight from memory (no copy of the model's bytes), or from its stored blobs
    when ``memo`` knows it unchanged. Returns its CRC-32 (for the zip) and CRC-32C (for the
    checkpoint), computed in the same pass."""
    crc32 = 0
    crc32c = 0
    pos = 0
    for offset, array in [*direct, (sparse.size, None)]:
        if offset > pos:  # HDF5 metadata (and small datasets) from the sparse file
            gap = sparse.read_range(pos, offset)
            out.pwrite(gap, data_start + pos)
            crc32 = fast_crc.crc32_update(crc32, gap)
            crc32c = fast_crc.crc32c_update(crc32c, gap)
        if array is None:
            break
        at = data_start + offset
        sums = memo.reuse(out, at, array)
        if sums is None:
            sums = _write_array(out, _byte_view(array), at)
        memo.note(out, at, array, sums)
        crc32 = fast_crc.crc32_combine(crc32, sums[0], array.nbytes)
        crc32c = fast_crc.crc32c_combine(crc32c, sums[1], array.nbytes)
        pos = offset + array.nbytes
    memo.done()
    return crc32, crc32c


def _write_array(out: Any, raw: np.ndarray, at: int) -> tuple[int, int]:
    """Write ``raw`` at ``at``; returns its CRC-32 and CRC-32C."""
    crc32 = crc32c = 0
    for start in range(0, raw.size, CHUNK_BYTES):
        chunk = raw[start : start + CHUNK_BYTES]
        out.pwrite(chunk, at + start)
        crc32 = fast_crc.crc32_update(crc32, chunk)
        crc32c = fast_crc.crc32c_update(crc32c, chunk)
    return crc32, crc32c


class _Memo:
    """One archive's use of a :class:`WriteMemo` (None: nothing remembered or reused)."""

    def __init__(self, memo: WriteMemo | None, hold: set[int]) -> None:
        self.memo = memo
        self.hold = hold
        self.held: dict[int, _Held] = {}

    def reuse(self, out: Any, at: int, array: Any) -> tuple[int, int] | None:
        """The checksums of ``array`` if it is the same buffer as last time, its chunks taken
        from their blobs (chunks that cannot be are written from the array)."""
        held = self.memo.held.get(at) if self.memo is not None else None
        if held is None or not _same_buffer(held.array, array):
            return None
        indices = out.covering(at, at + array.nbytes)
        if indices is None or len(indices) != len(held.shas):
            return None
        raw = _byte_view(array)
        for index, sha in zip(indices, held.shas, strict=True):
            start, length = out.range(index)
            if out.link_blob(index, sha):
                self.memo.reused_bytes += length
                continue
            for step in range(start - at, start - at + length, CHUNK_BYTES):
                piece = raw[step : min(step + CHUNK_BYTES, start - at + length)]
                out.pwrite(piece, at + step)
        return held.crc32, held.crc32c

    def note(self, out: Any, at: int, array: Any, sums: tuple[int, int]) -> None:
        if self.memo is None or id(array) not in self.hold or not isinstance(array, np.ndarray):
            return
        indices = out.covering(at, at + array.nbytes) or []
        shas = [out.digests.get(i) for i in indices]
        if indices and all(shas):
            self.held[at] = _Held(array, sums[0], sums[1], shas)  # type: ignore[arg-type]

    def done(self) -> None:
        if self.memo is not None:
            self.memo.held = self.held


def _cut_offsets(
    entries: list[_ZipEntry], spans: list[tuple[int, int]], data_start: int, cd_offset: int
) -> list[int]:
    """Sorted offsets where a piece of content begins or ends: each zip entry's header and data,
    each tensor inside ``model.weights.h5``, and the central directory."""
    found = {cd_offset}
    for entry in entries:
        start = data_start if entry.offset == 0 else entry.offset + len(entry.local_header())
        found.update((entry.offset, start, start + entry.size))
    for offset, length in spans:
        found.update((data_start + offset, data_start + offset + length))
    return sorted(found)
