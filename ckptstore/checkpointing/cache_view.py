"""A file of a remote checkpoint read in place from the restore cache (issue 41): a load by
UUID or a resume from S3 with a warm cache reads ``model.keras`` where the cache holds it,
with no link into a temporary folder and no copy.

Before, a warm load hard-linked the cached file into a temporary folder and removed the link
afterwards; each link changed the entry's ctime, so the next load found its identity changed
and hashed the whole file (SHA-256) on top of its crc32c. Here the cached file is opened, its
identity compared through the descriptor (then, unchanged, one crc32c pass; changed, its
recorded SHA-256 too: :meth:`.cache.RestoreCache.open_entry`) and read through a
:class:`CachedFile`, the :class:`~.chunk_view.ChunkedFile` the in-place loaders read. A
damaged entry is dropped and the file fetched again; a file not cached yet is fetched, verified
and moved into the cache (:func:`.restore.download_checkpoint`'s ``into_cache``), then read
there. The descriptor keeps the bytes if the entry is evicted meanwhile.

Example::

    with CheckpointContext("s3://bucket/ckpts") as ctx:
        views = {"model.keras": None}
        with ctx.read_in_place(uuid, selector="*.keras", views=views):
            header = views["model.keras"].pread(0, 30)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import restore
from ckptstore.checkpointing.chunk_view import ChunkedFile

if TYPE_CHECKING:
    from ckptstore.checkpointing.format import Manifest


class CachedFile(ChunkedFile):
    """The bytes of one verified cached file, read through the descriptor ``fd`` (owned:
    :meth:`close`); ``name``: the file's ``<uuid>/<relpath>``, for messages."""

    def __init__(self, name: str, path: str, fd: int, size: int) -> None:
        super().__init__(name, [path], [size])
        self.fd = fd

    def readinto(self, buf: Any, offset: int) -> int:
        view = memoryview(buf).cast("B")
        want = max(0, min(len(view), self.size - offset))
        done = 0
        while done < want:
            got = os.preadv(self.fd, [view[done:want]], offset + done)
            if got <= 0:  # the cached file shrank after it was checked
                raise errors.ChecksumMismatch(
                    f"The restore cache's copy of {self.name} ended early ({offset + done} of "
                    f"{self.size} bytes); it changed while it was read. Load it again."
                )
            done += got
        return done

    def crc32c(self) -> str:
        return cache_mod.fd_sums(self.fd, self.size)[0]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_views(
    ctx: Any,
    manifest: Manifest,
    select: Callable[[str], Any],
    views: dict[str, Any] | None,
    out_dir: str,
) -> Callable[[str], bool]:
    """Set each ``views[rel]`` still None that ``select`` picks to a :class:`CachedFile` of
    it when checkpoint context ``ctx`` has a restore cache and checks no signature (a signed
    file is checked on a download); returns the selector of the files left to download
    into ``out_dir`` (a file the cache could not keep is downloaded there)."""
    cache = ctx.cache
    wanted = [
        rel
        for rel, view in (views or {}).items()
        if view is None and select(rel) and rel in manifest.files and not rel.endswith("/")
    ]
    if cache is None or ctx.verify_key is not None or not wanted:
        return lambda rel: bool(select(rel))
    keys = {
        rel: restore.cache_key(ctx.storage, manifest.uuid, rel, manifest.files[rel])
        for rel in wanted
    }
    stats = cache_mod.LoadStats()
    missing = frozenset(
        rel for rel in wanted if not _open(ctx, manifest, rel, keys[rel], views, stats)
    )
    if stats.used:
        cache.record(stats)  # the entries read become the most recently used
        restore.log_load(ctx.storage, manifest.uuid, 0, stats.from_cache, cached=True)
    if missing:
        # A file larger than the cache's limit would be evicted as soon as it was recorded:
        # it stays in the folder (read from there), fetched once.
        limit = cache.limit()
        missing = frozenset(rel for rel in missing if manifest.files[rel].size <= limit)
    if missing:
        restore.download_checkpoint(
            ctx.storage,
            manifest.uuid,
            manifest,
            out_dir,
            missing.__contains__,
            verify=ctx.verify,
            cache=cache,
            into_cache=missing,
        )
        for rel in missing:
            _open(ctx, manifest, rel, keys[rel], views, None)
    placed = {rel for rel in missing if os.path.exists(os.path.join(out_dir, *rel.split("/")))}
    done = {rel for rel in wanted if views[rel] is not None} | placed
    return lambda rel: rel not in done and bool(select(rel))


def _open(
    ctx: Any,
    manifest: Manifest,
    rel: str,
    key: str,
    views: dict[str, Any],
    stats: cache_mod.LoadStats | None,
) -> bool:
    """Open ``views[rel]`` from cache entry ``key`` (``stats``: count it as a hit); whether
    it was served."""
    entry = manifest.files[rel]
    fd = ctx.cache.open_entry(key, entry)
    if fd is None:
        return False
    path = os.path.join(ctx.cache.root, *key.split("/"))
    views[rel] = CachedFile(f"{manifest.uuid}/{rel}", path, fd, entry.size)
    if stats is not None:
        stats.count(entry.size, hit=True)
        stats.use(key)
    return True


def close_views(views: dict[str, Any] | None) -> None:
    """Close the :class:`CachedFile` views :func:`open_views` opened."""
    for view in (views or {}).values():
        if isinstance(view, CachedFile):
            view.close()


__all__ = ["CachedFile", "close_views", "open_views"]
