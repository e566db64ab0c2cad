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
- Chunks are fixed-size (``chunk_bytes``, 4 MiB by default) at fixed file offsets: a file
  whose layout does not move (a ``model.keras`` of the same model, where frozen tensors keep
  their offsets) shares every chunk that did not change.
- The blob folder starts with ``.`` so no listing of checkpoints ever takes it for one.
- An in-flight upload names every blob it will reference in its pending marker *before* it
  looks for existing blobs; :func:`sweep` (run by GC) never deletes a blob a committed manifest
  or any pending marker names, and the writer checks the blobs it reused again after its
  commit (re-uploading one a concurrent sweep removed), so no committed checkpoint points at a
  missing blob. The sweep and the reverse lookup live in
  :mod:`~ckptstore.checkpointing.blob_gc`.

Example::

    from ckptstore.checkpointing import blobs
    chunks = blobs.chunk_file("/tmp/ckpt/model.keras")   # [{"sha256", "size"}, ...]
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptstore import errors

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

BLOBS_DIR = ".ckptstore-blobs"
DEFAULT_CHUNK_BYTES = 4 * 2**20
#: Threads uploading blobs of one checkpoint.
UPLOAD_WORKERS = 8
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


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


def plan(local_dir: str, entries: Mapping[str, Any], chunk_bytes: int) -> dict[str, dict[str, Any]]:
    """Entries with their ``blobs`` lists (folders stay as they are)."""
    planned: dict[str, dict[str, Any]] = {}
    for rel, entry in entries.items():
        if rel.endswith("/"):
            planned[rel] = dict(entry)
            continue
        path = os.path.join(local_dir, *rel.split("/"))
        planned[rel] = dict(entry, blobs=chunk_file(path, chunk_bytes))
    return planned


def upload(
    storage: Storage,
    local_dir: str,
    entries: Mapping[str, Any],
    chunk_bytes: int,
    *,
    workers: int = UPLOAD_WORKERS,
) -> UploadStats:
    """Create every blob ``entries`` names that storage does not hold yet (create-only), on
    ``workers`` threads (one request per chunk, so in parallel as a multipart upload is)."""
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
            else:
                seen.add(sha)
                todo.append((rel, sha, offset, size))
            offset += size

    def one(item: tuple[str, str, int, int]) -> bool:
        rel, sha, offset, size = item
        key = blob_key(sha)
        if storage.exists(key):
            return False
        with open(os.path.join(local_dir, *rel.split("/")), "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        return bool(storage.write_if_absent(key, data))

    with ThreadPoolExecutor(max(1, min(workers, len(todo)))) as pool:
        for item, created in zip(todo, pool.map(one, todo), strict=True):
            if created:
                stats.uploaded += item[3]
            else:
                stats.reused += item[3]
                stats.reused_keys.append(item)
    return stats


def recheck(storage: Storage, local_dir: str, stats: UploadStats) -> int:
    """After the commit: upload again any reused blob a concurrent sweep removed between our
    existence check and our manifest (see the module docstring). Returns how many."""
    healed = 0
    for rel, sha, offset, size in stats.reused_keys:
        key = blob_key(sha)
        if storage.exists(key):
            continue
        with open(os.path.join(local_dir, *rel.split("/")), "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        storage.write_if_absent(key, data)
        healed += 1
        logger.warning("Blob %s was removed while being reused; uploaded it again.", sha)
    return healed


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
) -> dict[str, int]:
    """Write every selected deduplicated file of ``manifest`` into ``local_dir`` as an
    ordinary file, verifying each blob. Returns ``{relpath: size}``."""
    written: dict[str, int] = {}
    for rel, entry in manifest["files"].items():
        if "blobs" not in entry or not select(rel):
            continue
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            for chunk in entry["blobs"]:
                f.write(read_blob(storage, chunk, verify=verify, where=f"{uuid}/{rel}"))
        written[rel] = entry["size"]
    return written
