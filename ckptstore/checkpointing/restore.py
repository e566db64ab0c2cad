"""The one download path: a committed checkpoint's files into a local folder, taken from the
restore cache (:mod:`.cache`) where it holds them and from storage otherwise, verified either
way. Every reader goes through :func:`download_checkpoint`: ``CheckpointContext.download`` and
``restore_path`` (so ``load_checkpoint_model``, ``core.init`` resume, ``job run``, TFKerasTrial
restore and the SDK's ``Checkpoint.download``), ``ckptstore checkpoint/model download`` and the
UI's archive download.

Example::

    from ckptstore.checkpointing import format as fmt, restore

    manifest = fmt.read_manifest(storage, uuid)
    report = restore.download_checkpoint(storage, uuid, manifest, "/tmp/ckpt")
    print(report.from_storage, report.from_cache)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptstore.checkpointing import blobs
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import format as fmt

if TYPE_CHECKING:
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
    manifest: Mapping[str, Any],
    out_dir: str,
    select: Callable[[str], bool] = lambda rel: True,
    *,
    verify: bool = True,
    cache: cache_mod.CacheOption = None,
    progress: ProgressCallback | None = None,
) -> DownloadReport:
    """Write the files of ``manifest`` that ``select`` picks into ``out_dir``.

    ``cache``: see :func:`.cache.resolve` (default: on for remote storage). Whole files found
    in the cache are hard-linked (or copied) into ``out_dir`` after their crc32c is checked;
    chunks found there are used after their SHA-256 is checked; everything else is fetched
    from storage and kept in the cache. ``verify`` checks what storage sent (sizes, crc32c,
    chunk SHA-256); what the cache holds is checked whatever ``verify`` says."""
    restore = cache_mod.resolve(cache, storage)
    stats = cache_mod.LoadStats()
    files = {rel: e for rel, e in manifest["files"].items() if select(rel)}
    os.makedirs(out_dir, exist_ok=True)
    linked = _link_cached(restore, storage, uuid, files, out_dir, stats, progress)
    whole = {rel for rel, e in files.items() if "blobs" not in e and rel not in linked}
    if whole:
        storage.download(uuid, out_dir, selector=lambda rel: rel in whole, progress=progress)
    fetched = {rel for rel in whole if not rel.endswith("/")}
    if verify:
        fmt.verify_files(out_dir, manifest, lambda rel: rel in fetched)
    for rel in fetched:
        key = restore.file_key(storage.url, uuid, rel, files[rel]) if restore else ""
        if restore is not None:
            restore.put_file(key, os.path.join(out_dir, *rel.split("/")))
        stats.add(key, files[rel]["size"], hit=False)

    def read(chunk: Mapping[str, Any], where: str) -> bytes:
        return _read_chunk(restore, storage, chunk, where, verify, stats, progress)

    blobs.assemble(storage, uuid, manifest, out_dir, lambda rel: rel in files, read=read)
    if verify:  # the whole crc32c of every reassembled file
        fmt.verify_files(out_dir, manifest, lambda rel: rel in files and "blobs" in files[rel])
    if restore is not None:
        restore.record(stats)
    report = DownloadReport(
        {r: e["size"] for r, e in files.items() if not r.endswith("/")},
        stats.from_storage,
        stats.from_cache,
        restore is not None,
    )
    logger.debug(
        "Checkpoint %s: %d bytes from storage %s, %d from the restore cache%s",
        uuid,
        report.from_storage,
        storage.url,
        report.from_cache,
        "" if restore else " (off)",
    )
    return report


def _link_cached(
    restore: cache_mod.RestoreCache | None,
    storage: Storage,
    uuid: str,
    files: Mapping[str, Mapping[str, Any]],
    out_dir: str,
    stats: cache_mod.LoadStats,
    progress: ProgressCallback | None,
) -> set[str]:
    """Place the whole files the cache holds intact; returns their relpaths."""
    linked: set[str] = set()
    if restore is None:
        return linked
    for rel, entry in files.items():
        if "blobs" in entry or rel.endswith("/"):
            continue
        key = restore.file_key(storage.url, uuid, rel, entry)
        if restore.link_file(key, os.path.join(out_dir, *rel.split("/")), entry):
            linked.add(rel)
            stats.add(key, entry["size"], hit=True)
            if progress is not None:
                progress(entry["size"])
    return linked


def _read_chunk(
    restore: cache_mod.RestoreCache | None,
    storage: Storage,
    chunk: Mapping[str, Any],
    where: str,
    verify: bool,
    stats: cache_mod.LoadStats,
    progress: ProgressCallback | None,
) -> bytes:
    sha, size = chunk["sha256"], chunk["size"]
    key = restore.blob_key(sha) if restore is not None else ""
    data = restore.read_blob(sha, size) if restore is not None else None
    hit = data is not None
    if data is None:
        # A chunk kept in the cache is always checked first: its name claims its SHA-256.
        data = blobs.read_blob(storage, chunk, verify=verify or restore is not None, where=where)
        if restore is not None:
            restore.put_bytes(key, data)
    stats.add(key, size, hit=hit)
    if progress is not None:
        progress(size)
    return data


__all__ = ["DownloadReport", "download_checkpoint"]
