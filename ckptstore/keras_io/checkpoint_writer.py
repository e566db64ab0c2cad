"""One background thread that writes and uploads checkpoints, so ``fit()`` does not wait on I/O.

The training thread hands over a :class:`SaveJob` (a model snapshot plus small files, already in
memory) and goes on training. The writer thread writes ``model.keras`` from the snapshot into the
checkpoint context's ``store_path()`` folder (on local storage that folder is renamed into place;
on object stores it is uploaded), then commits. At most one job runs and one waits: a save that
finds both slots taken blocks until the older job is done, which bounds memory to two snapshots.

A failure is kept and raised as :class:`~ckptstore.errors.BackgroundUploadError` by the next
:meth:`CheckpointWriter.check`, :meth:`~CheckpointWriter.submit` or :meth:`~CheckpointWriter.wait`
— never swallowed.

Example::

    writer = CheckpointWriter(core_context.checkpoint)
    writer.submit(SaveJob(snapshot=snap, metadata={"steps_completed": 10}))
    writer.wait()        # raises if the save failed
    print(writer.saved)  # [uuid]
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptstore import errors
from ckptstore.keras_io import snapshot as snapshot_lib

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SaveJob:
    """Everything one checkpoint needs, already captured in memory.

    ``files`` maps a relative name to bytes; ``extra_dir`` is a local folder whose content is
    moved into the checkpoint (``saved_model/``, files added by ``on_checkpoint_end``).
    ``on_done(uuid)`` runs in the writer thread after the commit.
    """

    snapshot: snapshot_lib.Snapshot | None
    metadata: dict[str, Any]
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    extra_dir: str | None = None
    on_done: Callable[[str], None] | None = None


class CheckpointWriter:
    """Writes :class:`SaveJob`\\ s in a daemon thread through a checkpoint context.

    Example::

        writer = CheckpointWriter(ckpt_context)
        writer.submit(job)
        writer.wait()
    """

    def __init__(self, checkpoint_context: Any, *, name: str = "ckptstore-keras-writer") -> None:
        self._ckpt = checkpoint_context
        self._queue: queue.Queue[SaveJob | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self.saved: list[str] = []
        #: Seconds each job took in the writer thread (for benchmarks and logs).
        self.write_seconds: list[float] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- training-thread side -----------------------------------------------------------------
    def check(self) -> None:
        """Raise the first background failure, if any (once)."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            if isinstance(error, errors.BackgroundUploadError):
                raise error
            raise errors.BackgroundUploadError(
                f"A background checkpoint save failed: {type(error).__name__}: {error}. "
                "Training state after the last committed checkpoint is not saved; fix the "
                "cause (storage reachable? disk full?) and resume from the latest checkpoint."
            ) from error

    def submit(self, job: SaveJob) -> None:
        """Queue ``job``; blocks only while an older job is still waiting for the thread."""
        self.check()
        if not self._thread.is_alive():
            raise errors.CheckpointError("The checkpoint writer was closed; cannot save.")
        with self._lock:
            self._pending += 1
        self._queue.put(job)

    def wait(self) -> None:
        """Block until every submitted job is committed; raise a failure if one happened."""
        with self._idle:
            while self._pending:
                self._idle.wait()
        self.check()

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        with self._lock:
            return self._pending > 0

    def close(self) -> None:
        """Finish queued jobs and stop the thread (does not raise; call :meth:`wait` first)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # ---- writer-thread side -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            started = time.perf_counter()
            try:
                with self._lock:
                    failed = self._error is not None
                if failed:
                    logger.warning("Skipping a checkpoint save: an earlier save failed.")
                else:
                    uuid = self._write(job)
                    self.saved.append(uuid)
                    if job.on_done is not None:
                        job.on_done(uuid)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                logger.error("Background checkpoint save failed: %s", exc, exc_info=True)
                with self._lock:
                    if self._error is None:
                        self._error = exc
            finally:
                self.write_seconds.append(time.perf_counter() - started)
                if job.extra_dir:
                    shutil.rmtree(job.extra_dir, ignore_errors=True)
                job.snapshot = None  # release the tensors now
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write(self, job: SaveJob) -> str:
        # The archive writer computes the file's crc32c while writing it; handing it to the
        # manifest spares reading the whole model again (contexts without the option re-read).
        checksums: dict[str, str] = {}
        extra = {"checksums": checksums} if _takes_checksums(self._ckpt) else {}
        with self._ckpt.store_path(job.metadata, **extra) as (path, uuid):
            path = os.fspath(path)
            if job.snapshot is not None:
                _size, crc32c = snapshot_lib.write_model_archive(
                    job.snapshot, os.path.join(path, snapshot_lib.MODEL_FILENAME)
                )
                checksums[snapshot_lib.MODEL_FILENAME] = crc32c
                job.snapshot = None  # the values are on disk: let the arrays go now
            for name, data in job.files.items():
                with open(os.path.join(path, name), "wb") as f:
                    f.write(data)
            if job.extra_dir and os.path.isdir(job.extra_dir):
                for entry in os.listdir(job.extra_dir):
                    shutil.move(os.path.join(job.extra_dir, entry), os.path.join(path, entry))
        logger.info(
            "Checkpoint %s committed (steps_completed=%s)",
            uuid,
            job.metadata.get("steps_completed"),
        )
        return str(uuid)


def _takes_checksums(ckpt: Any) -> bool:
    """Whether ``ckpt.store_path`` accepts precomputed ``checksums``."""
    try:
        return "checksums" in inspect.signature(ckpt.store_path).parameters
    except (TypeError, ValueError, AttributeError):
        return False
