"""The storage contract every backend implements.

A :class:`Storage` is rooted at one URL prefix (``s3://bucket/prefix``, ``/mnt/ckpts``, ...). All
``key`` arguments are ``/``-separated paths *relative to that prefix*; ``""`` is the prefix
itself. Keys are validated by :func:`ckptstore.storage_backends.paths.check_key` so nothing can
be read or written outside the prefix.

Example::

    from ckptstore.storage_backends import open_storage

    storage = open_storage("s3://my-bucket/ckpts")
    storage.upload("/tmp/ckpt", "0b7c.../")
    print(storage.list("0b7c..."))    # {"model.keras": 1234, "metadata.json": 210}
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping

from ckptstore import errors

#: Called with a number of bytes each time that many more bytes were transferred.
ProgressCallback = Callable[[int], None]
#: Chooses files by relative path: a callable, one glob, or several globs (any may match).
Selector = Callable[[str], bool] | str | Iterable[str] | None


def pwrite_all(fd: int, data, offset: int) -> int:  # type: ignore[no-untyped-def]
    """Write all of ``data`` (bytes-like) to ``fd`` at ``offset``; returns its length."""
    view = memoryview(data)
    total = len(view)
    done = 0
    while done < total:
        done += os.pwrite(fd, view[done:], offset + done)
    return total


class Storage(abc.ABC):
    """Bytes and file trees under one storage prefix.

    Subclasses implement the primitives below. ``url`` is the prefix URL with any credentials
    removed; it is safe to log.
    """

    #: The scheme this backend serves, e.g. ``"s3"``; set by subclasses.
    scheme: str = ""
    #: True when bytes cross a network to reach this storage (object stores, remote fsspec
    #: protocols): uploads cost time and money, so downloads go through the restore cache by
    #: default there.
    remote: bool = False

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:  # never shows credentials
        return f"{type(self).__name__}({self.url!r})"

    # ---- tree operations ----------------------------------------------------------------------
    @abc.abstractmethod
    def upload(
        self,
        local_dir: str,
        key: str,
        paths: Iterable[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, int]:
        """Upload files from ``local_dir`` to ``key/``; ``paths`` (relative, ``/``-separated)
        limits which files. Empty directories are kept as zero-byte ``dir/`` markers on object
        stores. Returns ``{relpath: size}`` of what was uploaded."""

    @abc.abstractmethod
    def download(
        self,
        key: str,
        local_dir: str,
        selector: Selector = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, int]:
        """Download every file under ``key/`` (or those the selector chooses) into
        ``local_dir``, recreating folders. Returns ``{relpath: size}`` of what was downloaded.
        Raises :class:`~ckptstore.errors.StorageNotFound` when nothing exists under ``key``."""

    @abc.abstractmethod
    def list(self, key: str) -> dict[str, int]:
        """``{relpath: size}`` of every file under ``key/`` (recursive); ``{}`` if none.
        Directory markers appear with a trailing ``/`` and size 0."""

    @abc.abstractmethod
    def list_children(self, key: str) -> list[str]:
        """Names of the immediate sub-folders of ``key/`` (no trailing slash), sorted."""

    @abc.abstractmethod
    def delete(self, key: str, globs: Iterable[str] | None = None) -> dict[str, int]:
        """Delete everything under ``key/`` (or only files matching ``globs``). Idempotent:
        already-missing files are fine. Returns what remains, ``{relpath: size}``."""

    # ---- single objects -----------------------------------------------------------------------
    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True if ``key`` is a file, or a folder with at least one file under it."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The whole object at ``key``; :class:`~ckptstore.errors.StorageNotFound` if absent."""

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Create or replace the object at ``key``."""

    @abc.abstractmethod
    def write_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create ``key`` only if it does not exist, atomically (S3 ``IfNoneMatch``, GCS
        ``ifGenerationMatch=0``, Azure ``If-None-Match: *``, local ``O_EXCL``). True if this
        call created it, False if it already existed. ``durable=False`` lets a local file
        system skip the fsync (content-addressed chunks: as durable as any file the OS
        writes back; object stores are durable either way)."""

    def replace_if_unchanged(self, key: str, expected: bytes, data: bytes) -> bool:
        """Replace the object at ``key`` with ``data`` only if it holds ``expected`` now,
        atomically (S3 ``IfMatch``, GCS ``ifGenerationMatch``, Azure ``If-Match`` on the
        version read with the bytes; a local file under an exclusive lock). True if replaced,
        False if it holds something else or is absent. A rewrite of a committed manifest
        (amend, export, partial delete) uses it, so a writer that wakes up after GC fenced
        the folder changes nothing. :class:`~ckptstore.errors.NotSupported` for a backend
        without conditional writes."""
        raise errors.NotSupported(
            f"{type(self).__name__} has no conditional writes (needed to rewrite a committed "
            "manifest safely). Use a local path, S3, GCS or Azure."
        )

    # ---- helpers with default implementations -------------------------------------------------
    def read_into(
        self,
        key: str,
        fd: int,
        offset: int,
        check: Callable[[bytes], None] | None = None,
    ) -> int:
        """Write the object at ``key`` into the open file ``fd`` at ``offset`` and return its
        size; ``check(data)`` sees the bytes first and may raise to stop the write (a chunk's
        SHA-256). A local store writes them with an in-kernel copy."""
        data = self.read_bytes(key)
        if check is not None:
            check(data)
        return pwrite_all(fd, data, offset)

    def write_range_if_absent(
        self, key: str, path: str, offset: int, length: int, *, durable: bool = True
    ) -> bool:
        """:meth:`write_if_absent` of bytes ``[offset, offset + length)`` of the local file
        ``path`` (a chunk of a staged checkpoint file). A local store copies them in the kernel
        instead of through Python (:class:`~ckptstore.storage_backends.local.LocalStorage`).
        A file shorter than the range raises :class:`~ckptstore.errors.CheckpointError`."""
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), length, offset)
        if len(data) != length:
            raise errors.CheckpointError(
                f"{path} changed while it was being stored: {len(data)} bytes at offset "
                f"{offset}, {length} expected. Do not modify a checkpoint folder being saved."
            )
        return self.write_if_absent(key, data, durable=durable)

    def link_if_absent(self, key: str, path: str, *, durable: bool = True) -> bool:
        """:meth:`write_if_absent` of the whole local file ``path`` (a chunk the writer wrote
        as its own file). A local store on the same file system hard-links it into place, so
        its bytes are written once (:class:`~ckptstore.storage_backends.local.LocalStorage`);
        the file must not change afterwards."""
        return self.write_range_if_absent(key, path, 0, os.path.getsize(path), durable=durable)

    def modified_at(self, key: str) -> float:
        """When the object at ``key`` was last written, by the *storage's* clock (epoch seconds:
        S3 ``LastModified``, GCS ``updated``, Azure ``last_modified``, a file's ``mtime``).
        GC judges age by this clock only, never by a writer's or collector's own, so machines
        whose clocks disagree cannot make it delete too early. S3 stamps whole seconds.
        :class:`~ckptstore.errors.StorageNotFound` if absent; :class:`~ckptstore.errors.
        NotSupported` for a backend that cannot tell."""
        raise errors.NotSupported(
            f"{type(self).__name__} cannot tell when an object was written (needed by GC to "
            "judge age on the storage's clock). Use a local path, S3, GCS or Azure."
        )

    def file_exists(self, key: str) -> bool:
        """True if ``key`` is a file. Object stores answer with one request (``exists`` also
        lists, to find folders); used for content-addressed blobs, which are never folders."""
        return self.exists(key)

    def local_path(self, key: str) -> str | None:
        """A local filesystem path for ``key`` when the storage is a local/shared file system
        (lets callers write in place and rename); None for remote storage."""
        return None

    def rename_dir_into(self, local_dir: str, key: str) -> bool:
        """Move a local staging folder to ``key`` without copying, if this backend can (local
        file systems). Returns False when the caller must upload instead."""
        return False

    def validate(self) -> None:
        """Write, read back and delete a probe object, as Determined does at start-up.
        Raises a :class:`~ckptstore.errors.StorageError` subclass naming the URL on failure."""
        import uuid

        from ckptstore import errors

        probe = f".ckptstore-validate-{uuid.uuid4().hex}"
        payload = b"ckptstore validate probe"
        self.write_bytes(probe, payload)
        try:
            got = self.read_bytes(probe)
            if got != payload:
                raise errors.StorageUnavailable(
                    f"Storage {self.url} returned different bytes than were written to a probe "
                    "object; check the endpoint and any proxy in between."
                )
        finally:
            self.delete(probe)

    @contextlib.contextmanager
    def staged_dir(self) -> Iterator[str]:
        """A temporary local folder removed on exit (for callers that build a tree to upload)."""
        import shutil
        import tempfile

        path = tempfile.mkdtemp(prefix="ckptstore-")
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release pools and clients. The storage must not be used afterwards."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_all(storages: Iterable[Storage]) -> None:
    """Close every storage; a failure to close one is logged (DEBUG) and does not stop the
    others (for owners of several storages: the CLI, the web UI)."""
    import logging

    for storage in storages:
        try:
            storage.close()
        except Exception:  # noqa: BLE001 - closing must not mask what came before
            logging.getLogger(__name__).debug("closing %r failed", storage, exc_info=True)


def describe_sizes(files: Mapping[str, int]) -> str:
    """``"3 files, 12.0 MiB"`` for log lines."""
    total = sum(files.values())
    return f"{len(files)} files, {total / 2**20:.1f} MiB"
