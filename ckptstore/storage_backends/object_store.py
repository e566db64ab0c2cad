"""Tree operations shared by every backend, built on a handful of per-object primitives.

A backend subclasses :class:`ObjectStorage` and implements ``_list_objects``, ``_upload_file``,
``_download_file``, ``_read``, ``_write``, ``_write_if_absent``, ``_delete_objects`` and
``_is_object`` on *full object names* (relative to the bucket/container/root), plus
``_is_transient`` and ``_translate`` for retries and error mapping. Upload, download, list,
delete with globs, selectors, directory markers, atomic local writes, concurrency and retries
live here once.

Example::

    from ckptstore.storage_backends import open_storage
    with open_storage("memory://demo", concurrency=4) as storage:
        storage.write_bytes("a/b.txt", b"hi")
        assert storage.list("a") == {"b.txt": 2}
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from ckptstore import errors
from ckptstore.storage_backends.base import (
    ProgressCallback,
    Selector,
    Storage,
    describe_sizes,
    pwrite_all,
)
from ckptstore.storage_backends.paths import check_key, check_relpath, compile_selector, join_key
from ckptstore.storage_backends.retry import RetryPolicy
from ckptstore.validators import int_at_least

logger = logging.getLogger(__name__)

#: Defaults for bulk transfer; every one can be overridden by a storage option of the same name.
DEFAULT_CONCURRENCY = 16
DEFAULT_PART_SIZE = 32 * 2**20
DEFAULT_MULTIPART_THRESHOLD = 64 * 2**20


def _positive_int(name: str, value: object) -> int:
    return int_at_least(name, value, 1, error=errors.InvalidStorageConfig)


def walk_local_tree(local_dir: str) -> tuple[dict[str, int], list[str]]:
    """``({relpath: size}, [empty folder relpaths])`` of a local folder, ``/``-separated."""
    if not os.path.isdir(local_dir):
        raise errors.StorageNotFound(
            f"Local folder {local_dir!r} to upload does not exist; pass an existing folder."
        )
    files: dict[str, int] = {}
    empty_dirs: list[str] = []
    for root, dirs, names in os.walk(local_dir):
        rel_root = os.path.relpath(root, local_dir).replace(os.sep, "/")
        rel_root = "" if rel_root == "." else rel_root
        for name in names:
            full = os.path.join(root, name)
            files[join_key(rel_root, name)] = os.path.getsize(full)
        if not dirs and not names and rel_root:
            empty_dirs.append(rel_root)
    return files, empty_dirs


#: In the name of every temporary file a local write makes (and listings skip).
TMP_MARK = ".ckptstore-tmp-"


def tmp_name(path: str) -> str:
    """A sibling temporary name for atomic writes (temp + rename)."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{TMP_MARK}{uuid.uuid4().hex[:12]}")


class ObjectStorage(Storage):
    """Base class of backends addressed by object name (everything except plain paths).

    Args:
        url: credential-free prefix URL (used in repr, logs and errors).
        prefix: object-name prefix under the bucket/container, no leading or trailing ``/``.
        concurrency: files (and parts of one big file) transferred at once. Default
            :attr:`default_concurrency` of the backend (16 unless it says otherwise).
        part_size: bytes per part of a multipart upload (and of a ranged download unless
            ``download_part_size`` is given). Default :attr:`default_part_size` of the backend
            (32 MiB unless it says otherwise).
        download_part_size: bytes per ranged GET of a big file. Default: ``part_size`` when
            that is given, else :attr:`default_download_part_size` of the backend (else its
            default part size). Separate because the best sizes differ: on moto, 64 MiB
            upload parts and 128 MiB download ranges were each the fastest measured.
        multipart_threshold: files at least this big go in parallel parts. Default
            :attr:`default_multipart_threshold` of the backend (64 MiB unless it says otherwise).
        max_attempts, timeout: see :class:`~ckptstore.storage_backends.retry.RetryPolicy`.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "",
        *,
        concurrency: int | None = None,
        part_size: int | None = None,
        download_part_size: int | None = None,
        multipart_threshold: int | None = None,
        max_attempts: int = 5,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(url)
        self.prefix = prefix.strip("/")
        self.concurrency = _positive_int(
            "concurrency", self.default_concurrency if concurrency is None else concurrency
        )
        self.part_size = _positive_int(
            "part_size", self.default_part_size if part_size is None else part_size
        )
        if download_part_size is None:
            download_part_size = (
                part_size
                if part_size is not None
                else self.default_download_part_size or self.part_size
            )
        self.download_part_size = _positive_int("download_part_size", download_part_size)
        self.multipart_threshold = _positive_int(
            "multipart_threshold",
            self.default_multipart_threshold
            if multipart_threshold is None
            else multipart_threshold,
        )
        self.retry = RetryPolicy(max_attempts=max_attempts, timeout=timeout)
        self._pool: ThreadPoolExecutor | None = None
        self._parts_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    #: Names per ``_delete_objects`` call (batches run concurrently on the pool).
    _delete_batch: int = 1000

    #: Per-backend transfer defaults (used when the option is not given); each backend sets
    #: the values measured fastest against its server (see benchmarks/storage_throughput.py).
    default_concurrency: int = DEFAULT_CONCURRENCY
    default_part_size: int = DEFAULT_PART_SIZE
    default_download_part_size: int | None = None  # None: the part size
    default_multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD

    # ---- primitives a backend implements (full object names) ---------------------------------
    def _list_objects(self, prefix: str) -> dict[str, int]:
        """``{full name: size}`` of every object whose name starts with ``prefix``."""
        raise NotImplementedError

    def _upload_file(self, name: str, path: str, size: int) -> None:
        raise NotImplementedError

    def _download_file(self, name: str, path: str, size: int) -> None:
        """Write object ``name`` to local ``path`` (a temporary name the caller renames).

        Default: one streamed GET below ``multipart_threshold``, else parallel ranged GETs, both
        through :meth:`_get_into`. Backends with their own transfer manager override this."""
        if size < self.multipart_threshold:
            with open(path, "wb") as f:
                self._get_into(name, f.fileno(), 0, None)
            return
        self._parallel_parts(
            name, path, size, lambda fd, start, length: self._get_into(name, fd, start, length)
        )

    def _get_into(self, name: str, fd: int, start: int, length: int | None) -> None:
        """Stream bytes ``[start, start + length)`` of ``name`` (the whole object when
        ``length`` is None) into ``fd`` at the same offsets; a short body raises
        ``ConnectionError`` so the part is retried."""
        raise NotImplementedError

    #: True when :meth:`_get_into` takes ``on_piece`` (called with each piece of the body
    #: before it is written) and returns the bytes written: :meth:`read_into` then streams.
    _streams_pieces = False

    def read_into(
        self, key: str, fd: int, offset: int, check: Callable[[bytes], None] | None = None
    ) -> int:
        """:meth:`Storage.read_into`, streamed into ``fd`` as the body arrives (no copy of the
        whole object in memory) when the backend can and ``check`` is None or takes pieces
        (``reset()`` per attempt, ``update(piece)``, then ``finish()``, which raises on bad
        content: the caller discards what was written, as a failed chunk's part file is)."""
        update = getattr(check, "update", None)
        if not self._streams_pieces or (check is not None and update is None):
            return super().read_into(key, fd, offset, check)
        name = self._name(key)

        def attempt() -> int:
            if check is not None:
                check.reset()  # type: ignore[attr-defined]
            return int(self._get_into(name, fd, offset, None, on_piece=update))  # type: ignore[call-arg, func-returns-value]

        size = self._call(attempt, name, "read")
        if check is not None:
            check.finish()  # type: ignore[attr-defined]
        return size

    def _read(self, name: str) -> bytes:
        raise NotImplementedError

    def _write(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    #: True when :meth:`_write_if_absent` takes ``sync`` (a local file system's fsync).
    _fsyncs = False

    def _write_if_absent(self, name: str, data: bytes) -> bool:
        raise NotImplementedError

    def _delete_objects(self, names: list[str]) -> None:
        """Delete these objects; missing ones are fine."""
        raise NotImplementedError

    def _replace_if_match(self, name: str, expected: bytes, data: bytes) -> bool:
        """Replace ``name`` with ``data`` only if it holds ``expected`` now, atomically
        (the object's version read with its bytes, then a write conditional on it).
        Backends without conditional writes keep the base class's refusal."""
        return Storage.replace_if_unchanged(self, name, expected, data)

    def _is_object(self, name: str) -> bool:
        raise NotImplementedError

    def _modified(self, name: str) -> float:
        """The storage's own timestamp of object ``name`` (epoch seconds); raise the client's
        not-found error if absent. Backends that cannot tell keep the base class's refusal."""
        return Storage.modified_at(self, name)

    def _is_transient(self, exc: BaseException) -> bool:
        """True for failures worth retrying (5xx, 429, timeouts, connection resets)."""
        return isinstance(exc, (TimeoutError, ConnectionError))

    def _translate(self, exc: BaseException, name: str, exhausted: bool) -> errors.StorageError:
        """Map a client exception to a :mod:`ckptstore.errors` type naming the URL."""
        return default_translate(exc, self.object_url(name), exhausted, self.retry.max_attempts)

    def _close_clients(self) -> None:
        """Release backend clients (called by :meth:`close`)."""

    # ---- helpers ------------------------------------------------------------------------------
    def object_url(self, name: str) -> str:
        """Credential-free URL of a full object name (for messages)."""
        base = self.url.split("://", 1)[0] + "://" + self._bucket_label()
        return f"{base}/{name}" if name else base

    def _bucket_label(self) -> str:
        rest = self.url.split("://", 1)[-1]
        if self.prefix and rest.endswith("/" + self.prefix):
            return rest[: -len(self.prefix) - 1]
        return rest.rstrip("/")

    def _name(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def _dir(self, key: str) -> str:
        name = self._name(key)
        return name + "/" if name else ""

    def _call(self, fn, name: str, what: str):  # type: ignore[no-untyped-def]
        return self.retry.call(
            fn,
            is_transient=self._is_transient,
            translate=lambda exc, exhausted: self._translate(exc, name, exhausted),
            what=f"{what} {self.object_url(name)}",
        )

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The storage's thread pool for concurrent file transfers (created on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="ckptstore-io"
                )
            return self._pool

    @property
    def parts_pool(self) -> ThreadPoolExecutor:
        """A second pool for the parts of one big file (files run on :attr:`pool`; parts must
        not wait on the same pool or a full pool would deadlock)."""
        with self._pool_lock:
            if self._parts_pool is None:
                self._parts_pool = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="ckptstore-part"
                )
            return self._parts_pool

    def _part_ranges(self, size: int, step: int | None = None) -> list[tuple[int, int]]:
        """``[(start, length), ...]`` covering ``size`` bytes in ``step`` pieces (default
        ``download_part_size``: the ranges of a parallel download; uploads pass
        ``part_size``)."""
        step = step or self.download_part_size
        return [(start, min(step, size - start)) for start in range(0, size, step)]

    def _ranged_download(self, name: str, path: str, size: int, fetch) -> None:  # type: ignore[no-untyped-def]
        """Fill local ``path`` with ``size`` bytes by calling ``fetch(start, length) -> bytes``
        for every part concurrently on :attr:`parts_pool` (each part retried on its own)."""

        def write_part(fd: int, start: int, length: int) -> None:
            data = fetch(start, length)
            if len(data) != length:
                raise errors.StorageUnavailable(
                    f"Short read from {self.object_url(name)} at offset {start}: got "
                    f"{len(data)} of {length} bytes; retry the download."
                )
            pwrite_all(fd, data, start)

        self._parallel_parts(name, path, size, write_part)

    def _parallel_parts(self, name: str, path: str, size: int, write_part) -> None:  # type: ignore[no-untyped-def]
        """Fill local ``path`` (``size`` bytes) by running ``write_part(fd, start, length)`` for
        every ``download_part_size`` range concurrently on :attr:`parts_pool`; each part writes its own
        bytes at its offset (``os.pwrite``) and is retried on its own."""
        with open(path, "wb") as f:
            f.truncate(size)
            fd = f.fileno()

            def part(start: int, length: int) -> None:
                self._call(lambda: write_part(fd, start, length), name, "download part")

            futures = [self.parts_pool.submit(part, s, n) for s, n in self._part_ranges(size)]
            first = None
            for future in futures:
                exc = future.exception()
                if exc is not None and first is None:
                    first = exc
            if first is not None:
                raise first

    def _run_all(self, jobs: list) -> None:  # type: ignore[type-arg]
        """Run zero-arg callables on the pool; re-raise the first failure after all finish."""
        if not jobs:
            return
        if len(jobs) == 1:
            jobs[0]()
            return
        futures = [self.pool.submit(job) for job in jobs]
        first: BaseException | None = None
        for future in futures:
            exc = future.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first

    # ---- Storage API --------------------------------------------------------------------------
    def upload(
        self,
        local_dir: str,
        key: str,
        paths: Iterable[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, int]:
        base = self._name(key)
        files, empty_dirs = walk_local_tree(local_dir)
        if paths is not None:
            wanted = [check_relpath(p) for p in paths]
            missing = [p for p in wanted if p not in files]
            if missing:
                raise errors.StorageNotFound(
                    f"Files {missing[:5]} to upload are not in {local_dir!r}; pass paths "
                    "relative to the folder, '/'-separated."
                )
            files = {p: files[p] for p in wanted}
            empty_dirs = []
        for relpath in files:
            check_relpath(relpath)

        def job(relpath: str, size: int):  # type: ignore[no-untyped-def]
            def run() -> None:
                name = join_key(base, relpath)
                local = os.path.join(local_dir, *relpath.split("/"))
                self._call(lambda: self._upload_file(name, local, size), name, "upload")
                if progress is not None:
                    progress(size)

            return run

        def marker(relpath: str):  # type: ignore[no-untyped-def]
            def run() -> None:
                name = join_key(base, relpath) + "/"
                self._call(lambda: self._write(name, b""), name, "upload")

            return run

        # Big files first so they overlap with the many small ones.
        order = sorted(files.items(), key=lambda item: -item[1])
        self._run_all([job(r, s) for r, s in order] + [marker(d) for d in empty_dirs])
        result = dict(files)
        result.update({d + "/": 0 for d in empty_dirs})
        logger.debug("uploaded %s to %s", describe_sizes(result), self.object_url(base))
        return result

    def download(
        self,
        key: str,
        local_dir: str,
        selector: Selector = None,
        progress: ProgressCallback | None = None,
    ) -> dict[str, int]:
        base = self._name(key)
        listing = self.list(key)
        if not listing:
            raise errors.StorageNotFound(
                f"Nothing found under {self.object_url(base)}; check the key (checkpoint UUID) "
                "and the storage URL."
            )
        chosen = compile_selector(selector)
        selected = {r: s for r, s in listing.items() if chosen(r)}
        os.makedirs(local_dir, exist_ok=True)

        def job(relpath: str, size: int):  # type: ignore[no-untyped-def]
            def run() -> None:
                check_relpath(relpath)
                local = os.path.join(local_dir, *relpath.rstrip("/").split("/"))
                if relpath.endswith("/"):
                    os.makedirs(local, exist_ok=True)
                    return
                os.makedirs(os.path.dirname(local), exist_ok=True)
                name = join_key(base, relpath)
                tmp = tmp_name(local)
                try:
                    self._call(lambda: self._download_file(name, tmp, size), name, "download")
                    os.replace(tmp, local)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                if progress is not None:
                    progress(size)

            return run

        order = sorted(selected.items(), key=lambda item: -item[1])
        self._run_all([job(r, s) for r, s in order])
        return selected

    def list(self, key: str) -> dict[str, int]:
        prefix = self._dir(key)
        found = self._call(lambda: self._list_objects(prefix), prefix, "list")
        out = {}
        for name, size in found.items():
            rel = name[len(prefix) :]
            if rel:
                out[rel] = size
        return dict(sorted(out.items()))

    def list_children(self, key: str) -> list[str]:
        children = {rel.split("/", 1)[0] for rel in self.list(key) if "/" in rel}
        return sorted(children)

    def delete(self, key: str, globs: Iterable[str] | None = None) -> dict[str, int]:
        prefix = self._dir(key)
        listing = self.list(key)
        if globs is None:
            doomed = [prefix + rel for rel in listing]
            name = self._name(key)
            if name and self._call(lambda: self._is_object(name), name, "stat"):
                doomed.append(name)
            remaining: dict[str, int] = {}
        else:
            chosen = compile_selector(list(globs))
            doomed = [prefix + rel for rel in listing if chosen(rel)]
            remaining = {r: s for r, s in listing.items() if not chosen(r)}
        batch = self._delete_batch
        chunks = [doomed[i : i + batch] for i in range(0, len(doomed), batch)]
        self._run_all(
            [
                (lambda c=c: self._call(lambda: self._delete_objects(c), prefix, "delete"))
                for c in chunks
            ]
        )
        return remaining

    def exists(self, key: str) -> bool:
        name = self._name(key)
        if name and self._call(lambda: self._is_object(name), name, "stat"):
            return True
        return bool(self.list(key))

    def file_exists(self, key: str) -> bool:
        name = self._name(key)
        return bool(name) and bool(self._call(lambda: self._is_object(name), name, "stat"))

    def modified_at(self, key: str) -> float:
        name = self._name(key)
        return float(self._call(lambda: self._modified(name), name, "stat"))

    def read_bytes(self, key: str) -> bytes:
        name = self._name(key)
        return self._call(lambda: self._read(name), name, "read")

    def write_bytes(self, key: str, data: bytes) -> None:
        name = join_key(self.prefix, check_relpath(key))
        self._call(lambda: self._write(name, bytes(data)), name, "write")

    def replace_if_unchanged(self, key: str, expected: bytes, data: bytes) -> bool:
        name = join_key(self.prefix, check_relpath(key))
        try:
            return bool(
                self._call(
                    lambda: self._replace_if_match(name, expected, bytes(data)), name, "write"
                )
            )
        except errors.StorageNotFound:
            return False

    def write_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        name = join_key(self.prefix, check_relpath(key))
        if not durable and self._fsyncs:
            return self._call(lambda: self._write_if_absent(name, data, sync=False), name, "write")
        return self._call(lambda: self._write_if_absent(name, bytes(data)), name, "write")

    def close(self) -> None:
        with self._pool_lock:
            for pool in (self._pool, self._parts_pool):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._pool = self._parts_pool = None
        self._close_clients()


def default_translate(
    exc: BaseException, url: str, exhausted: bool, attempts: int
) -> errors.StorageError:
    """Generic mapping used when a backend has nothing more specific."""
    if exhausted:
        return errors.StorageUnavailable(
            f"Storage at {url} kept failing after {attempts} attempts ({type(exc).__name__}); "
            "check the endpoint and network, or raise max_attempts/timeout."
        )
    if isinstance(exc, FileNotFoundError):
        return errors.StorageNotFound(
            f"{url} does not exist; check the key and that the bucket/folder was created."
        )
    if isinstance(exc, PermissionError):
        return errors.StoragePermissionError(
            f"Permission denied on {url}; grant the credentials read/write access to it."
        )
    if isinstance(exc, (TimeoutError, ConnectionError, OSError)):
        return errors.StorageUnavailable(
            f"Storage at {url} failed ({type(exc).__name__}); check the endpoint and network."
        )
    return errors.StorageError(f"Storage operation on {url} failed ({type(exc).__name__}).")
