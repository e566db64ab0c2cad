"""The one download path: a committed checkpoint's files into a local folder, taken from the
restore cache (:mod:`.cache`) where it holds them and from storage otherwise, verified either
way. Every reader goes through :func:`download_checkpoint`: ``CheckpointContext.download`` and
``restore_path`` (so ``load_checkpoint_model``, ``core.init`` resume, ``job run``, TFKerasTrial
restore and the SDK's ``Checkpoint.download``), ``ckptstore checkpoint/model download`` and the
UI's archive download.

Example::

    from ckptstore.checkpointing import format as fmt, restore

    manifest = fmt.load_manifest(storage, uuid)
    report = restore.download_checkpoint(storage, uuid, manifest, "/tmp/ckpt")
    print(report.from_storage, report.from_cache)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs, signing
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import format as fmt
from ckptstore.storage_backends.base import pwrite_all

if TYPE_CHECKING:
    from ckptstore.checkpointing.entries import Chunk, FileEntry
    from ckptstore.storage_backends.base import ProgressCallback, Storage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DownloadReport:
    """What a download wrote: ``files`` ``{relpath: size}``, and how many bytes came from
    storage and from the restore cache (their sum is the files' size, less chunks a file
    repeats)."""

    files: dict[str, int]
    from_storage: int
    from_cache: int
    cached: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "bytes": sum(self.files.values()),
            "bytes_from_storage": self.from_storage,
            "bytes_from_cache": self.from_cache,
            "cache": self.cached,
        }


def download_checkpoint(
    storage: Storage,
    uuid: str,
    manifest: fmt.Manifest,
    out_dir: str,
    select: Callable[[str], bool] = lambda rel: True,
    *,
    verify: bool = True,
    cache: cache_mod.CacheOption = None,
    progress: ProgressCallback | None = None,
    sha256: dict[str, str] | None = None,
    signed: Mapping[str, str] | None = None,
    into_cache: frozenset[str] = frozenset(),
) -> DownloadReport:
    """Write the files of ``manifest`` that ``select`` picks into ``out_dir``.

    ``into_cache``: files the caller reads from the cache itself
    (:mod:`.cache_view`): each one fetched is moved into the cache, not left in ``out_dir``
    (where it stays only if the cache could not keep it).

    ``signed``: ``{path: SHA-256}`` a checked signature vouches for; a cached file whose
    SHA-256 is not its signed one is a miss (dropped, fetched from storage): an entry with the
    right size and crc32c but other bytes cannot make a signed checkpoint fail to load.

    ``sha256``: a dict that receives the SHA-256 of every file written (what a signature is
    compared with), computed by the read that checks its crc32c, whether it came from storage
    or the cache (the cache keeps no digests: a file placed from it is read once to check its
    crc32c, and that read hashes it too).

    ``cache``: see :func:`.cache.resolve` (default: on for remote storage). A file the cache
    holds whole is hard-linked (or copied) into ``out_dir`` once its crc32c matches; a
    deduplicated file's chunks are read from cached files holding them once their SHA-256
    matches; everything else comes from storage, and each file is kept in the cache. ``verify``
    checks what storage sent (sizes, crc32c, chunk SHA-256); what the cache holds is checked
    whatever ``verify`` says."""
    restore = cache_mod.resolve(cache, storage)
    stats = cache_mod.LoadStats()
    files = {rel: e for rel, e in manifest.files.items() if select(rel)}
    os.makedirs(out_dir, exist_ok=True)
    keys = _keys(restore, storage, uuid, files)
    linked = _link_cached(restore, keys, files, out_dir, stats, progress, sha256, signed)
    whole = {rel for rel, e in files.items() if not blobs.is_chunked(e) and rel not in linked}
    if whole:
        storage.download(uuid, out_dir, selector=lambda rel: rel in whole, progress=progress)
    fetched = {rel for rel in whole if not rel.endswith("/")}
    stats.count(sum(files[rel].size for rel in fetched), hit=False)
    assembled = {rel for rel, e in files.items() if blobs.is_chunked(e) and rel not in linked}
    # A local store's chunks are copied in the kernel unhashed: the whole-file crc32c below
    # checks what they make up (a cache keeps chunks by SHA-256: checked one by one).
    each_chunk = verify and (restore is not None or storage.local_path("") is None)
    _assemble(restore, storage, uuid, manifest, out_dir, assembled, each_chunk, stats, progress)
    if verify or sha256 is not None:
        try:
            fmt.verify_files(
                out_dir,
                manifest,
                lambda rel: rel in whole or rel in assembled,
                sha256=sha256,
                check=verify,
            )
        except errors.ChecksumMismatch:
            if verify and not each_chunk:
                _name_damaged_chunk(storage, uuid, manifest, assembled)
            raise
    if restore is not None:
        for rel in fetched | assembled:
            path = os.path.join(out_dir, *rel.split("/"))
            restore.put_file(keys[rel], path, move=rel in into_cache)
            stats.use(keys[rel], blobs.chunks_of(files[rel]))
        restore.record(stats)
    report = DownloadReport(
        {r: e.size for r, e in files.items() if not r.endswith("/")},
        stats.from_storage,
        stats.from_cache,
        restore is not None,
    )
    log_load(storage, uuid, report.from_storage, report.from_cache, cached=restore is not None)
    return report


def log_load(
    storage: Storage, uuid: str, from_storage: int, from_cache: int, *, cached: bool
) -> None:
    """The DEBUG line of one read of checkpoint ``uuid``: bytes from storage, from the cache."""
    logger.debug(
        "Checkpoint %s: %d bytes from storage %s, %d from the restore cache%s",
        uuid,
        from_storage,
        storage.url,
        from_cache,
        "" if cached else " (off)",
    )


def download_signed(
    storage: Storage,
    uuid: str,
    manifest: fmt.Manifest,
    out_dir: str,
    select: Callable[[str], bool],
    public_key: signing.KeyPath,
    *,
    partial: bool,
    **options: Any,
) -> DownloadReport:
    """:func:`download_checkpoint` of a checkpoint that must be signed by ``public_key``:
    refused (:class:`~ckptstore.errors.SignatureError`) unsigned, before any other file is
    fetched, or with a foreign envelope; then every file's SHA-256, from the read that checks
    its crc32c, is compared with the signature (``partial``: ``select`` left signed files
    out). The one signed download: ``CheckpointContext.download`` and the CLI's.
    ``options``: :func:`download_checkpoint`'s."""

    def fetch() -> str:
        only = lambda rel: rel == signing.SIGNATURE_NAME  # noqa: E731
        download_checkpoint(storage, uuid, manifest, out_dir, only, **options)
        return os.path.join(out_dir, signing.SIGNATURE_NAME)

    signed = signing.SIGNATURE_NAME in manifest.files
    where = f"{uuid} in {storage.url}"
    expected = signing.envelope(where, signed, fetch, public_key, subject=uuid)
    digests: dict[str, str] = {}
    wanted = lambda rel: rel != signing.SIGNATURE_NAME and select(rel)  # noqa: E731
    signed = expected.digests if expected.algorithm == signing.HASH_ALGORITHM else None
    report = download_checkpoint(
        storage, uuid, manifest, out_dir, wanted, sha256=digests, signed=signed, **options
    )
    try:
        expected.compare(out_dir, digests, partial=partial)
    except errors.SignatureError:
        # Refused files are not left where the caller (or a later load) would take them.
        for rel in report.files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(out_dir, *rel.split("/")))
        raise
    return report


def _name_damaged_chunk(
    storage: Storage, uuid: str, manifest: fmt.Manifest, rels: set[str]
) -> None:
    """Raise :class:`~ckptstore.errors.ChecksumMismatch` naming the first missing or damaged
    chunk of the deduplicated files ``rels`` (each read and hashed; nothing if all are intact)."""
    for rel in sorted(rels):
        for chunk in blobs.chunks_of(manifest.files[rel]):
            blobs.read_blob(storage, chunk, verify=True, where=f"{uuid}/{rel}")


def _keys(
    restore: cache_mod.RestoreCache | None,
    storage: Storage,
    uuid: str,
    files: Mapping[str, FileEntry],
) -> dict[str, str]:
    """The cache key of every selected file (none without a cache)."""
    if restore is None:
        return {}
    return {
        rel: cache_key(storage, uuid, rel, e) for rel, e in files.items() if not rel.endswith("/")
    }


def cache_key(storage: Storage, uuid: str, rel: str, entry: FileEntry) -> str:
    """The restore cache's key of file ``rel`` of checkpoint ``uuid``: by its chunks for a
    deduplicated file (shared by checkpoints and storages), else by where it comes from."""
    if blobs.is_chunked(entry):
        return cache_mod.RestoreCache.content_key(blobs.chunks_of(entry))
    return cache_mod.RestoreCache.file_key(storage.url, uuid, rel, entry)


def _link_cached(
    restore: cache_mod.RestoreCache | None,
    keys: Mapping[str, str],
    files: Mapping[str, FileEntry],
    out_dir: str,
    stats: cache_mod.LoadStats,
    progress: ProgressCallback | None,
    sha256: dict[str, str] | None,
    signed: Mapping[str, str] | None,
) -> set[str]:
    """Place the files the cache holds whole and intact (hashed into ``sha256``; the signed
    digest where ``signed`` names one); returns their relpaths."""
    linked: set[str] = set()
    if restore is None:
        return linked
    for rel, key in keys.items():
        entry = files[rel]
        target = os.path.join(out_dir, *rel.split("/"))
        sha = restore.link_file(key, target, entry, sha256=sha256 is not None)
        if sha is not None and signed is not None and signed.get(rel, sha) != sha:
            os.unlink(target)
            restore.drop(key)
            sha = None
        if sha is not None:
            if sha256 is not None:
                sha256[rel] = sha
            linked.add(rel)
            stats.count(entry.size, hit=True)
            stats.use(key)
            if progress is not None:
                progress(entry.size)
    return linked


def _assemble(
    restore: cache_mod.RestoreCache | None,
    storage: Storage,
    uuid: str,
    manifest: fmt.Manifest,
    out_dir: str,
    wanted: set[str],
    verify: bool,
    stats: cache_mod.LoadStats,
    progress: ProgressCallback | None,
) -> None:
    """Reassemble the deduplicated files in ``wanted``: each chunk from a cached file that
    holds it (SHA-256 checked) or from storage."""
    if not wanted:
        return
    places = (
        restore.chunk_places(
            c.sha256 for rel in wanted for c in blobs.chunks_of(manifest.files[rel])
        )
        if restore is not None
        else {}
    )

    def place(chunk: Chunk, fd: int, offset: int, where: str) -> None:
        sha, size = chunk.sha256, chunk.size
        found = restore.read_chunk(sha, size, places[sha]) if restore and sha in places else None
        if found is not None:
            stats.use(found[0])  # a use of the cached file it came from
            pwrite_all(fd, found[1], offset)
        else:
            # Kept in the cache under a content key: always checked, whatever ``verify`` says.
            blobs.place_blob(
                storage, chunk, fd, offset, verify=verify or restore is not None, where=where
            )
        stats.count(size, hit=found is not None)
        if progress is not None:
            progress(size)

    blobs.assemble(storage, uuid, manifest, out_dir, wanted.__contains__, place=place)


__all__ = ["DownloadReport", "cache_key", "download_checkpoint", "download_signed"]
