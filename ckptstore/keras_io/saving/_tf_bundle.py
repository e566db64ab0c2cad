"""Where each tensor's bytes are in TensorFlow's checkpoint files, so deduplicated commits cut
their chunks there.

A TensorFlow *tensor bundle* — the ``variables/variables.{index,data-*}`` of a SavedModel, the
``<prefix>.{index,data-*}`` of ``tf.train.Checkpoint`` / Keras 2 ``save_weights`` — keeps the
tensors' bytes back to back in ``<prefix>.data-%05d-of-%05d`` shards and, in ``<prefix>.index``,
one ``BundleEntryProto`` per tensor (shard, offset, size, masked crc32c). The index is a
LevelDB-style table (``tsl/lib/io/table.cc``, ``block.cc``, ``format.cc``), read here without
TensorFlow's C++: a 48-byte footer (metaindex and index block handles, varint64 offset and
size each, padded, then the magic ``0xdb4775248b80fb57`` little-endian), an index block whose
values are the handles of the data blocks, and data blocks of prefix-compressed entries
(varint32 shared, non-shared and value lengths, the key's new suffix, the value) ended by a
restart array (uint32s) and its length (uint32); every block is followed by a 5-byte trailer
(compression type, masked crc32c of the block and that byte). TensorFlow writes these tables
uncompressed; a compressed block is refused.

:func:`shard_cuts` gives, per data shard, every tensor's start and end; :func:`folder_cuts`
does it for every bundle in a checkpoint folder, keyed by path relative to that folder — the
``cuts`` that ``CheckpointContext.store_path(cuts=...)`` takes, so a changed tensor of a
SavedModel or a Keras 2 checkpoint costs its own bytes in a deduplicated checkpoint, as in
``model.keras``. Cuts are only an optimisation: any file these functions cannot read is logged
at debug level and gets no cuts (the commit then cuts it at fixed offsets); they never raise.
The entries themselves are parsed with TensorFlow's ``tensor_bundle_pb2`` (imported on first
use).

Example::

    from ckptstore.keras_io.saving import _tf_bundle as tf_bundle
    tf_bundle.shard_cuts("ckpt/saved_model/variables/variables.index")
    # {"variables.data-00000-of-00001": [0, 1024, 4195328, ...]}
    cuts = tf_bundle.folder_cuts("ckpt")
    # {"saved_model/variables/variables.data-00000-of-00001": [...], ...}
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterator
from typing import Any

from ckptstore.checkpointing import checksums

logger = logging.getLogger(__name__)

INDEX_SUFFIX = ".index"
#: ``kTableMagicNumber``, the last 8 bytes of every table (little-endian).
TABLE_MAGIC = 0xDB4775248B80FB57
#: ``Footer::kEncodedLength``: two block handles of at most 10 + 10 bytes, then the magic.
FOOTER_BYTES = 48
#: ``kBlockTrailerSize``: compression type (1 byte) and masked crc32c (4 bytes).
TRAILER_BYTES = 5
_NO_COMPRESSION = 0
_MASK_DELTA = 0xA282EAD8
#: A bundle's index is a few bytes per tensor; a larger ``*.index`` is not one.
MAX_INDEX_BYTES = 256 * 2**20
_DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


class BundleFormatError(ValueError):
    """The file is not a tensor bundle index this module can read."""


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's (and LevelDB's) masked CRC-32C of ``data``."""
    crc = checksums.crc32c_update(0, data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# ---- the table -------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int, limit: int, bits: int) -> tuple[int, int]:
    result = shift = 0
    while pos < limit and shift < bits:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise BundleFormatError("bad varint")


def _block(data: bytes, handle: tuple[int, int]) -> bytes:
    """The contents of the block at ``handle`` (offset, size), its trailer checked."""
    offset, size = handle
    end = offset + size
    if end + TRAILER_BYTES > len(data) - FOOTER_BYTES:
        raise BundleFormatError(f"block [{offset}, {end}) runs past the table's end")
    kind = data[end]
    if kind != _NO_COMPRESSION:
        raise BundleFormatError(
            f"block at {offset} is compressed (type {kind}); TensorFlow writes tensor bundle "
            "indexes uncompressed and only those are read"
        )
    (stored,) = struct.unpack_from("<I", data, end + 1)
    if masked_crc32c(data[offset : end + 1]) != stored:
        raise BundleFormatError(f"block at {offset} fails its crc32c")
    return data[offset:end]


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every entry of a block, in order."""
    if len(block) < 4:
        raise BundleFormatError("block shorter than its restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 * (1 + restarts)
    if restarts < 1 or limit < 0:
        raise BundleFormatError(f"block with {restarts} restarts in {len(block)} bytes")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos, limit, 32)
        unshared, pos = _varint(block, pos, limit, 32)
        value_len, pos = _varint(block, pos, limit, 32)
        if shared > len(key) or pos + unshared + value_len > limit:
            raise BundleFormatError("corrupted block entry")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + value_len]
        pos += value_len


def read_table(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of the table ``data`` (a whole ``.index`` file), in key order."""
    if len(data) < FOOTER_BYTES:
        raise BundleFormatError(f"{len(data)} bytes: shorter than a table footer")
    footer = data[-FOOTER_BYTES:]
    (magic,) = struct.unpack_from("<Q", footer, FOOTER_BYTES - 8)
    if magic != TABLE_MAGIC:
        raise BundleFormatError(f"bad table magic {magic:#x}")
    limit = FOOTER_BYTES - 8
    _meta_offset, pos = _varint(footer, 0, limit, 64)
    _meta_size, pos = _varint(footer, pos, limit, 64)
    index_offset, pos = _varint(footer, pos, limit, 64)
    index_size, pos = _varint(footer, pos, limit, 64)
    for _separator, handle in _entries(_block(data, (index_offset, index_size))):
        offset, at = _varint(handle, 0, len(handle), 64)
        size, _ = _varint(handle, at, len(handle), 64)
        yield from _entries(_block(data, (offset, size)))


# ---- the bundle ------------------------------------------------------------------------------
def read_index(path: str) -> tuple[Any, dict[str, Any]]:
    """``(BundleHeaderProto, {tensor key: BundleEntryProto})`` of the bundle index at ``path``.
    Raises :class:`BundleFormatError` (or ``OSError``) when it cannot be read."""
    from tensorflow.core.protobuf import tensor_bundle_pb2

    if os.path.getsize(path) > MAX_INDEX_BYTES:
        raise BundleFormatError(f"{path} is larger than {MAX_INDEX_BYTES} bytes")
    with open(path, "rb") as f:
        data = f.read()
    header = None
    entries: dict[str, Any] = {}
    for key, value in read_table(data):
        try:
            if key == b"":  # kHeaderEntryKey
                header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
            else:
                entries[key.decode("utf-8", "surrogateescape")] = (
                    tensor_bundle_pb2.BundleEntryProto.FromString(value)
                )
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise BundleFormatError(f"entry {key!r} is not a bundle proto: {exc}") from exc
    if header is None:
        raise BundleFormatError(f"{path} has no bundle header entry")
    return header, entries


def data_filename(prefix: str, shard: int, num_shards: int) -> str:
    """``<prefix>.data-%05d-of-%05d``, as ``DataFilename`` in ``tensor_bundle.cc``."""
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def _shard_cuts(index_path: str) -> dict[str, list[int]]:
    header, entries = read_index(index_path)
    num_shards = int(header.num_shards)
    if num_shards < 1:
        raise BundleFormatError(f"header says {num_shards} shards")
    prefix = os.path.basename(index_path)[: -len(INDEX_SUFFIX)]
    folder = os.path.dirname(index_path)
    found: dict[int, set[int]] = {}
    for key, entry in entries.items():
        if entry.slices and not entry.size:
            continue  # a partitioned variable: each slice is an entry of its own
        if not 0 <= entry.shard_id < num_shards or entry.offset < 0 or entry.size < 0:
            raise BundleFormatError(f"entry {key!r} points outside the bundle")
        found.setdefault(int(entry.shard_id), set()).update(
            (int(entry.offset), int(entry.offset + entry.size))
        )
    cuts: dict[str, list[int]] = {}
    for shard, offsets in sorted(found.items()):
        name = data_filename(prefix, shard, num_shards)
        size = os.path.getsize(os.path.join(folder, name))
        if max(offsets) > size:
            raise BundleFormatError(f"{name} has {size} bytes; entries end at {max(offsets)}")
        cuts[name] = sorted(offsets)
    return cuts


def shard_cuts(index_path: str) -> dict[str, list[int]] | None:
    """``{data shard file name (beside the index): sorted offsets}`` where each tensor of the
    bundle at ``index_path`` begins and ends; None (logged at debug) when the index or its
    shards cannot be read — never raises."""
    try:
        return _shard_cuts(os.fspath(index_path))
    except Exception as exc:  # noqa: BLE001 - cuts are an optimisation: fixed offsets instead
        logger.debug("No tensor cuts for %s (cut at fixed offsets): %s", index_path, exc)
        return None


def folder_cuts(folder: str) -> dict[str, list[int]]:
    """Cuts for the data shards of every tensor bundle under ``folder`` (any ``*.index`` with
    a ``.data-*`` shard beside it), keyed by ``/``-separated path relative to ``folder``.
    Bundles that cannot be read are left out (debug log); never raises."""
    folder = os.fspath(folder)
    cuts: dict[str, list[int]] = {}
    try:
        for root, _dirs, files in os.walk(folder):
            names = set(files)
            for name in sorted(names):
                if not name.endswith(INDEX_SUFFIX):
                    continue
                prefix = name[: -len(INDEX_SUFFIX)]
                if not any(n.startswith(prefix + ".data-") and _DATA_RE.search(n) for n in names):
                    continue
                found = shard_cuts(os.path.join(root, name))
                rel_dir = os.path.relpath(root, folder).replace(os.sep, "/")
                for shard, offsets in (found or {}).items():
                    rel = shard if rel_dir == "." else f"{rel_dir}/{shard}"
                    cuts[rel] = offsets
    except Exception as exc:  # noqa: BLE001 - as shard_cuts
        logger.debug("No tensor cuts for the bundles in %s: %s", folder, exc)
    return cuts


def add_folder_cuts(folder: str, cuts: dict[str, list[int]] | None) -> None:
    """Add :func:`folder_cuts` of ``folder`` to ``cuts`` (the dict handed to ``store_path``),
    keeping cuts already there; does nothing when ``cuts`` is None."""
    if cuts is None:
        return
    for rel, offsets in folder_cuts(folder).items():
        cuts.setdefault(rel, offsets)
