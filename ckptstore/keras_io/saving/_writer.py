"""One background thread that writes and uploads checkpoints, so ``fit()`` does not wait on I/O.

The training thread hands over a :class:`SaveJob` (a model snapshot plus small files, already in
memory) and goes on training. The writer thread writes ``model.keras`` from the snapshot into the
checkpoint context's ``store_path()`` folder; a second thread runs the job's ``before_commit``
(the SavedModel export) and commits (on local storage the folder is renamed into place; on object
stores it is uploaded), in submission order. At most one job is being written and one waits in
memory: a save that finds both slots taken blocks until the older job is written, which bounds
memory to two snapshots. Written checkpoints waiting for a slow ``before_commit`` wait on disk.

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

import contextlib
import dataclasses
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing import blobs
from ckptstore.checkpointing.hints import CommitHints
from ckptstore.keras_io.saving import _keras_archive as keras_archive
from ckptstore.keras_io.saving import _snapshot as snapshot_lib
from ckptstore.keras_io.saving import _tf_bundle as tf_bundle

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SaveJob:
    """Everything one checkpoint needs, already captured in memory.

    ``files`` maps a relative name to bytes; ``extra_dir`` is a local folder whose content is
    moved into the checkpoint (``saved_model/``, files added by ``on_checkpoint_end``).
    ``before_commit(path)`` runs in the writer thread once every file is in the checkpoint
    folder ``path`` and before the commit (e.g. the SavedModel export); raising discards the
    checkpoint. ``on_done(uuid)`` runs in the writer thread after the commit. ``cuts``
    (``{name: [offset, ...]}``) says where the parts of a file in ``files`` begin and end, so a
    deduplicated commit cuts its chunks there (parts that did not change cost nothing). The
    TensorFlow checkpoint files in the folder (Keras 2 ``model_checkpoint.*``, a SavedModel's
    ``variables/``, from ``extra_dir`` or ``before_commit``) get cuts at their tensors without
    being named here (:mod:`~ckptstore.keras_io.saving._tf_bundle`).
    """

    snapshot: snapshot_lib.Snapshot | None
    metadata: dict[str, Any]
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    extra_dir: str | None = None
    on_done: Callable[[str], None] | None = None
    before_commit: Callable[[str], None] | None = None
    cuts: dict[str, list[int]] = dataclasses.field(default_factory=dict)


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
        #: The frozen arrays of the last archive written as chunks (the next skips them).
        self.memo = keras_archive.WriteMemo()
        self.saved: list[str] = []
        #: Seconds each job took in the writer thread (for benchmarks and logs).
        self.write_seconds: list[float] = []
        #: Written checkpoints waiting for ``before_commit`` and the commit (on disk, unbounded).
        self._commits: queue.Queue[_Staged | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._committer = threading.Thread(
            target=self._run_commits, name=f"{name}-commit", daemon=True
        )
        self._thread.start()
        self._committer.start()

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

    @property
    def closed(self) -> bool:
        """Whether the thread has stopped (after :meth:`close`)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """Finish queued jobs and stop the thread (does not raise; call :meth:`wait` first)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._committer.join()

    # ---- writer-thread side -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                self._commits.put(None)
                return
            started = time.perf_counter()
            staged: _Staged | None = None
            try:
                with self._lock:
                    failed = self._error is not None
                if failed:
                    logger.warning("Skipping a checkpoint save: an earlier save failed.")
                else:
                    staged = self._stage(job, started)
                    self._commits.put(staged)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._fail(exc)
            finally:
                job.snapshot = None  # release the tensors now
                if staged is None:
                    self._finish(job, started)

    def _stage(self, job: SaveJob, started: float) -> _Staged:
        """Write every file of ``job`` into a ``store_path()`` folder; the commit (after
        ``before_commit``) is left to the commit thread, so a slow ``before_commit`` (the
        SavedModel export) holds up later checkpoints only on disk, not in memory."""
        # The archive writer computes the file's crc32c while writing it; handing it to the
        # manifest spares reading the whole model again (contexts without the option re-read).
        # It also knows where each tensor's bytes are: deduplicated uploads cut chunks there.
        hints = CommitHints()
        checksums, cuts = hints.checksums, hints.cuts
        scope = self._ckpt.store_path(job.metadata, hints=hints)
        path, uuid = scope.__enter__()
        try:
            path = os.fspath(path)
            write_into = getattr(job.snapshot, "write_into", None)
            if write_into is not None:  # Keras 2: TensorFlow's own checkpoint files
                checksums.update(write_into(path))
                job.snapshot = None
            elif job.snapshot is not None:
                offsets: list[int] = []
                split = self._split_bytes(job)
                _size, crc32c = snapshot_lib.write_model_archive(
                    job.snapshot,
                    os.path.join(path, snapshot_lib.MODEL_FILENAME),
                    cuts=offsets,
                    split=split,
                    blob_dir=self._ckpt.storage.local_path(blobs.BLOBS_DIR) if split else None,
                    memo=self.memo,
                )
                checksums[snapshot_lib.MODEL_FILENAME] = crc32c
                cuts[snapshot_lib.MODEL_FILENAME] = offsets
                job.snapshot = None  # the values are on disk: let the arrays go now
            for name, data in job.files.items():
                with open(os.path.join(path, name), "wb") as f:
                    f.write(data)
                if job.cuts.get(name):
                    cuts[name] = list(job.cuts[name])
            if job.extra_dir and os.path.isdir(job.extra_dir):
                for entry in os.listdir(job.extra_dir):
                    shutil.move(os.path.join(job.extra_dir, entry), os.path.join(path, entry))
        except BaseException as exc:
            scope.__exit__(type(exc), exc, exc.__traceback__)  # discards the folder
            raise
        return _Staged(job, scope, path, str(uuid), started, hints)

    def _split_bytes(self, job: SaveJob) -> int | None:
        """The chunk size to write ``model.keras`` as its chunks in (a local deduplicated
        store links them into its blob folder: each new byte written once), or None: an
        export (``before_commit``) reads the whole file before the commit."""
        chunk_bytes = getattr(self._ckpt, "write_once_chunk_bytes", None)
        if job.before_commit is not None or not callable(chunk_bytes):
            return None
        return chunk_bytes()

    # ---- commit-thread side -------------------------------------------------------------------
    def _run_commits(self) -> None:
        while True:
            staged = self._commits.get()
            if staged is None:
                return
            try:
                self._commit(staged)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._fail(exc)
            finally:
                self._finish(staged.job, staged.started)

    def _commit(self, staged: _Staged) -> None:
        job = staged.job
        with self._lock:
            failed = self._error is not None
        if failed:
            logger.warning("Skipping a checkpoint commit: an earlier save failed.")
            skip = errors.CheckpointError("an earlier checkpoint save failed")
            staged.scope.__exit__(type(skip), skip, None)  # discards the folder
            return
        try:
            if job.before_commit is not None:
                job.before_commit(staged.path)
        except BaseException as exc:
            staged.scope.__exit__(type(exc), exc, exc.__traceback__)  # discards the folder
            raise
        if self._ckpt.dedup:
            # Every file is there now: cut TensorFlow's data shards (Keras 2 weights, the
            # SavedModel's variables) at their tensors, as model.keras is cut at its own.
            tf_bundle.add_folder_cuts(staged.path, staged.hints.cuts)
        staged.scope.__exit__(None, None, None)  # the commit
        logger.debug(
            "Checkpoint %s committed (steps_completed=%s)",
            staged.uuid,
            job.metadata.get("steps_completed"),
        )
        self.saved.append(staged.uuid)
        if job.on_done is not None:
            job.on_done(staged.uuid)

    # ---- both ---------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        logger.error("Background checkpoint save failed: %s", exc, exc_info=True)
        with self._lock:
            if self._error is None:
                self._error = exc

    def _finish(self, job: SaveJob, started: float) -> None:
        self.write_seconds.append(time.perf_counter() - started)
        if job.extra_dir:
            shutil.rmtree(job.extra_dir, ignore_errors=True)
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()


@dataclasses.dataclass
class _Staged:
    """A checkpoint whose files are written, waiting in its open ``store_path()`` scope."""

    job: SaveJob
    scope: contextlib.AbstractContextManager[Any]
    path: str
    uuid: str
    started: float
    #: What ``store_path(hints=...)`` reads when the scope exits (the commit).
    hints: CommitHints
