"""A deduplicated file of a local store read where its bytes are: in its chunk files under
``<store>/.ckptstore-blobs/``, never reassembled into a copy (issue 41).

A resume reads a 312 MiB ``model.keras`` (weights + Adam's slots); reassembling it first wrote
312 MiB of page cache that the loader then read again. :func:`open_in_place` checks the file
exactly as a download of it is checked (every chunk's size, then the whole file's crc32c in one
pass over the chunk files; a mismatch is named by its chunk, as the download names it) and
returns a :class:`ChunkedFile`, which reads any byte range of the file from the chunk files with
``os.pread``.

Example::

    view = open_in_place(storage, uuid, manifest, "model.keras")
    if view is not None:
        header = view.pread(0, 30)
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs
from ckptstore.checkpointing.checksums import crc32c_update
from ckptstore.checkpointing.format import compile_selector

if TYPE_CHECKING:
    from ckptstore.checkpointing.format import Manifest
    from ckptstore.storage_backends.base import Storage


class ChunkedFile:
    """The bytes of one deduplicated file, read from its chunk files (``paths``, in order,
    of ``sizes`` bytes). ``name``: the file's ``<uuid>/<relpath>``, for messages."""

    def __init__(self, name: str, paths: list[str], sizes: list[int]) -> None:
        self.name = name
        self.paths = paths
        self.sizes = sizes
        self.starts = [0]
        for size in sizes:
            self.starts.append(self.starts[-1] + size)
        self.size = self.starts[-1]

    def readinto(self, buf: Any, offset: int) -> int:
        """Fill ``buf`` (a writable buffer) with the bytes at ``offset``; returns how many
        (fewer only at the end of the file)."""
        view = memoryview(buf).cast("B")
        done = 0
        i = bisect.bisect_right(self.starts, offset) - 1
        while done < len(view) and 0 <= i < len(self.sizes):
            at = offset + done - self.starts[i]
            want = min(len(view) - done, self.sizes[i] - at)
            fd = os.open(self.paths[i], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                got = os.preadv(fd, [view[done : done + want]], at)
            finally:
                os.close(fd)
            if got != want:  # the chunk shrank after open_in_place checked it
                raise errors.ChecksumMismatch(
                    f"Blob {os.path.basename(self.paths[i])} of {self.name} ended early "
                    f"({got} of {want} bytes at {at}); the store changed while it was read."
                )
            done += got
            i += 1
        return done

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer at the end of the file)."""
        buf = bytearray(max(0, min(size, self.size - offset)))
        return bytes(buf[: self.readinto(buf, offset)])

    def crc32c(self) -> str:
        """The crc32c of the whole file (8 hex digits), one pass over its chunk files."""
        crc = 0
        for path in self.paths:
            with open(path, "rb", buffering=0) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    continue
                # mapped, not read: no copy out of the page cache (a third of read()'s CPU)
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    crc = crc32c_update(crc, mapped)
        return f"{crc:08x}"


def open_in_place(
    storage: Storage, uuid: str, manifest: Manifest, rel: str, *, verify: bool = True
) -> ChunkedFile | None:
    """A verified :class:`ChunkedFile` of deduplicated file ``rel`` of checkpoint ``uuid``
    when ``storage`` is a local store (its chunks are files there), else None.

    Raises:
        ChecksumMismatch: a missing or damaged chunk (named), or a whole-file crc32c that is
            not the manifest's.
    """
    root = storage.local_path("")
    entry = manifest.files.get(rel)
    if root is None or entry is None or not blobs.is_chunked(entry):
        return None
    chunks = blobs.chunks_of(entry)
    paths = [os.path.join(root, *blobs.blob_key(c.sha256).split("/")) for c in chunks]
    view = ChunkedFile(f"{uuid}/{rel}", paths, [c.size for c in chunks])
    if not verify:
        return view
    for path, chunk in zip(paths, chunks, strict=True):
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        if size != chunk.size:  # read and hashed: the same error a download raises
            blobs.read_blob(storage, chunk, verify=True, where=view.name)
    if view.size != entry.size or view.crc32c() != entry.crc32c:
        for chunk in chunks:  # name the damaged chunk, as a download does
            blobs.read_blob(storage, chunk, verify=True, where=view.name)
        raise errors.ChecksumMismatch(
            f"File {rel!r} of checkpoint {uuid} does not match its manifest (crc32c); the "
            "checkpoint is damaged. Run `ckptstore checkpoint verify` to list what is."
        )
    return view


def open_views(
    ctx: Any, manifest: Manifest, selector: Any, views: dict[str, Any] | None
) -> Callable[[str], bool]:
    """Set each ``views[rel]`` the selector picks to :func:`open_in_place`'s view of it (None
    where the file is not read in place); returns the selector of the files left to download
    (``CheckpointContext.read_in_place``'s ``views``: where such a file is deduplicated on a
    local store of checkpoint context ``ctx`` and no signature is checked, it is verified as
    ``ctx.verify`` says and read in place from its chunks, not written into the folder)."""
    select = compile_selector(selector)
    if not views or ctx.verify_key is not None:  # a signature is checked on a download
        return select
    for rel in views:
        if select(rel):
            views[rel] = open_in_place(ctx.storage, manifest.uuid, manifest, rel, verify=ctx.verify)
    kept = {rel for rel, view in views.items() if view is not None}
    return lambda rel: rel not in kept and bool(select(rel))


__all__ = ["ChunkedFile", "open_in_place", "open_views"]
