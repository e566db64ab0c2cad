"""Background uploads with a bounded number in flight.

:class:`BackgroundUploader` runs commit jobs on worker threads. ``submit`` blocks while
``max_in_flight`` jobs are running (so a fast training loop cannot pile up unbounded copies),
``wait`` blocks until every job finished and re-raises the first failure as
:class:`~ckptstore.errors.BackgroundUploadError`; a failure not yet reported also surfaces at the
next ``submit``.

Example::

    uploader = BackgroundUploader(max_in_flight=2)
    uploader.submit("0b7c...", lambda: commit_dir(...))
    uploader.wait()
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptstore import errors
from ckptstore.storage_backends.local import copy_range
from ckptstore.validators import int_at_least

logger = logging.getLogger(__name__)


_FICLONE = 0x40049409  # Linux ioctl: copy-on-write clone (btrfs, xfs, ...)
_RANGE = 64 * 2**20
_COPY_THREADS = 4


def _try_clone(src_fd: int, dst_fd: int) -> bool:
    try:
        import fcntl

        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
        return True
    except (ImportError, OSError):
        return False


def _copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> None:
    if copy_range(src_fd, dst_fd, count, offset, offset) != count:
        raise OSError(f"the file being copied ended before offset {offset} + {count}")


def _copy_file(src: str, dst: str, pool: ThreadPoolExecutor) -> None:
    """Copy one file: a copy-on-write clone where the file system has them, else in-kernel
    ``copy_file_range`` over 64 MiB ranges in parallel, else :func:`shutil.copyfile`."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        if _try_clone(fin.fileno(), fout.fileno()):
            return
        size = os.fstat(fin.fileno()).st_size
        if not hasattr(os, "copy_file_range") or size == 0:
            shutil.copyfileobj(fin, fout, 8 * 2**20)
            return
        try:
            os.ftruncate(fout.fileno(), size)
            ranges = [(off, min(_RANGE, size - off)) for off in range(0, size, _RANGE)]
            jobs = [pool.submit(_copy_range, fin.fileno(), fout.fileno(), o, n) for o, n in ranges]
            for job in jobs:
                job.result()
            return
        except OSError as exc:  # e.g. old kernels, some network file systems
            logger.debug("copy_file_range failed for %s (%s); copying with read/write", src, exc)
    shutil.copyfile(src, dst)


def snapshot_dir(src: str, dst: str) -> None:
    """Copy the tree ``src`` to a new folder ``dst``: real copies (or copy-on-write clones),
    never hard links, so later in-place writes to ``src`` cannot reach the snapshot. Large
    files are copied in parallel ranges to keep the caller's stall short."""
    os.makedirs(dst)
    pairs = []
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target_root = dst if rel == "." else os.path.join(dst, rel)
        for d in dirs:
            os.makedirs(os.path.join(target_root, d), exist_ok=True)
        pairs += [(os.path.join(root, n), os.path.join(target_root, n)) for n in files]
    with (
        ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="ckptstore-snapshot") as ranges,
        ThreadPoolExecutor(_COPY_THREADS) as files_pool,
    ):
        for job in [files_pool.submit(_copy_file, s, d, ranges) for s, d in pairs]:
            job.result()


def move_dir(src: str, dst: str) -> bool:
    """Rename ``src`` to ``dst`` (same file system); False if that is not possible."""
    try:
        os.rename(src, dst)
        return True
    except OSError:
        return False


class BackgroundUploader:
    """Runs upload jobs on threads, at most ``max_in_flight`` at once.

    Args:
        max_in_flight: how many uploads may run at the same time; ``submit`` blocks beyond it.
    """

    def __init__(self, max_in_flight: int = 2) -> None:
        max_in_flight = int_at_least("max_in_flight", max_in_flight, 1)
        self.max_in_flight = max_in_flight
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._executor = ThreadPoolExecutor(max_in_flight, thread_name_prefix="ckptstore-upload")
        self._lock = threading.Lock()
        self._futures: dict[str, Future[None]] = {}
        self._error: tuple[str, BaseException] | None = None

    @property
    def in_flight(self) -> list[str]:
        """UUIDs whose upload has not finished."""
        with self._lock:
            return [u for u, f in self._futures.items() if not f.done()]

    def raise_pending_error(self) -> None:
        """Raise (once) the first background failure not yet reported."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            uuid, cause = error
            raise errors.BackgroundUploadError(
                f"The background upload of checkpoint {uuid} failed: {cause}. The checkpoint "
                "was not committed; fix the cause and save again."
            ) from cause

    def acquire_slot(self) -> None:
        """Block until fewer than ``max_in_flight`` uploads run; pair with :meth:`submit`."""
        self.raise_pending_error()
        self._slots.acquire()

    def release_slot(self) -> None:
        """Give back a slot taken by :meth:`acquire_slot` when no job will be submitted."""
        self._slots.release()

    def submit(
        self, uuid: str, job: Callable[[], None], cleanup: Callable[[], None] | None = None
    ) -> None:
        """Run ``job`` in the background; call after :meth:`acquire_slot`. ``cleanup`` runs
        after the job whatever happens (e.g. removing a snapshot folder)."""

        def run() -> None:
            try:
                job()
            except BaseException as exc:
                logger.error("Background upload of checkpoint %s failed: %s", uuid, exc)
                with self._lock:
                    if self._error is None:
                        self._error = (uuid, exc)
                raise
            finally:
                if cleanup is not None:
                    try:
                        cleanup()
                    except Exception as exc:  # cleanup must never hide the real outcome
                        logger.warning("Cleanup after uploading %s failed: %s", uuid, exc)
                self._slots.release()

        try:
            future = self._executor.submit(run)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._futures[uuid] = future
            self._futures = {u: f for u, f in self._futures.items() if not f.done() or u == uuid}

    def wait(self) -> None:
        """Block until every submitted upload finished; re-raise the first failure."""
        with self._lock:
            futures = list(self._futures.values())
        for future in futures:
            try:
                future.result()
            except BaseException:  # recorded in self._error by run()
                pass
        with self._lock:
            self._futures = {u: f for u, f in self._futures.items() if not f.done()}
        self.raise_pending_error()

    def close(self) -> None:
        """Wait for running uploads and stop the threads (errors are logged, not raised)."""
        try:
            self.wait()
        except errors.BackgroundUploadError as exc:
            logger.error("%s", exc)
        self._executor.shutdown(wait=True)
