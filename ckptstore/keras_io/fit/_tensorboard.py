"""``TensorBoard``: Keras's TensorBoard callback, with its logs synced to checkpoint storage."""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import tempfile
from typing import Any

from ckptstore import errors
from ckptstore.core._tensorboard import TensorboardSync
from ckptstore.defaults import TENSORBOARD_PREFIX
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.backend import check_model, keras

logger = logging.getLogger(__name__)

__all__ = ["TENSORBOARD_PREFIX", "TensorBoard", "TrialTensorBoard"]


class TensorBoard(keras.callbacks.TensorBoard):
    """Keras's ``TensorBoard`` callback whose log folder is copied to
    ``<checkpoint storage>/tensorboard/<trial id>/``.

    After each epoch the chief flushes the event files and uploads what changed on a
    background thread (training does not wait; an upload still running at the next epoch end
    is not doubled up); at the end of training it uploads everything and waits. An upload that
    fails at an epoch end is logged and retried at the next one; a failure of the final upload
    raises :class:`~ckptstore.errors.StorageError` from ``fit()``.

    Args:
        core_context: the context from ``ckptstore.core.init()``.
        **kwargs: any argument of ``keras.callbacks.TensorBoard``. ``log_dir`` defaults to a
            local temporary folder (removed at the end of training); pass one to keep the logs.

    Example::

        tb = ckptstore.keras.TensorBoard(core_context, histogram_freq=1)
        model.fit(x, y, epochs=5, callbacks=[det_cb, tb])
        # tensorboard --logdir <local copy of s3://bucket/ckpts/tensorboard/1>
    """

    def __init__(self, core_context: Any, *args: Any, **kwargs: Any) -> None:
        if args:  # Determined's signature: (core_context, log_dir, histogram_freq, ...)
            if "log_dir" in kwargs:
                raise errors.InvalidConfig(
                    "log_dir was given both positionally and as a keyword; pass it once. "
                    f"Received: {args[0]!r} and log_dir={kwargs['log_dir']!r}."
                )
            kwargs["log_dir"], args = args[0], args[1:]
        self._owns_log_dir = "log_dir" not in kwargs
        if self._owns_log_dir:
            kwargs["log_dir"] = tempfile.mkdtemp(prefix="ckptstore-tb-")
        super().__init__(*args, **kwargs)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._future: concurrent.futures.Future[None] | None = None
        if core_context is not None:
            self.bind_core_context(core_context)

    def bind_core_context(self, core_context: Any) -> None:
        """Sync to ``core_context``'s storage (the TFKerasTrial controller calls this for
        :class:`TrialTensorBoard`, which users create without a context)."""
        self._core = core_context
        self._is_chief = getattr(core_context.distributed, "rank", 0) == 0
        trial_id = getattr(getattr(core_context.info, "trial", None), "trial_id", None)
        self._sync = TensorboardSync(core_context.checkpoint.storage, self.log_dir, trial_id)
        self.storage_key = self._sync.key

    # ---- keras hooks --------------------------------------------------------------------------
    def set_model(self, model: KerasModel) -> None:
        check_model(model, what="TensorBoard")
        super().set_model(model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if not self._is_chief:
            return
        if self._future is not None and not self._future.done():
            return  # previous sync still running; the next epoch end catches up
        self._collect_failure(raise_it=False)
        self._flush()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ckptstore-tb-sync"
            )
        self._future = self._executor.submit(self.sync)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)  # closes the writers: event files are complete
        if not self._is_chief:
            return
        try:
            if self._future is not None:
                self._future.exception()  # wait; failure is retried just below
            self.sync()
        except errors.CkptstoreError:
            raise
        except Exception as exc:
            raise errors.StorageError(
                f"Uploading TensorBoard logs to {self.storage_key} failed: {exc}"
            ) from exc
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._future = None
            if self._owns_log_dir:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    # ---- syncing ------------------------------------------------------------------------------
    def sync(self) -> list[str]:
        """Upload new or changed files of the log folder; returns their relative paths."""
        return self._sync.upload()

    def _flush(self) -> None:
        for writer in getattr(self, "_writers", {}).values():
            try:
                writer.flush()
            except Exception as exc:  # noqa: BLE001 - flushing is an optimisation
                logger.debug("TensorBoard writer flush failed: %s", exc)

    def _collect_failure(self, *, raise_it: bool) -> None:
        if self._future is None or not self._future.done():
            return
        exc = self._future.exception()
        self._future = None
        if exc is not None:
            logger.warning(
                "TensorBoard log upload to %s failed (retried at the next epoch end): %s",
                self.storage_key,
                exc,
            )
            if raise_it:
                raise errors.StorageError(f"TensorBoard log upload failed: {exc}") from exc


class TrialTensorBoard(TensorBoard):
    """Determined's ``det.keras.callbacks.TensorBoard`` for a ``TFKerasTrial``'s
    ``keras_callbacks()``: Keras's TensorBoard callback writing to a trial-owned folder that is
    synced to ``<storage>/tensorboard/<trial id>/`` like :class:`TensorBoard`.

    As in Determined, each training workload (``scheduling_unit`` batches) is one TensorBoard
    "epoch" (``workload_end_count`` counts them and is restored on resume), and ``log_dir`` is
    ignored with a warning. Takes Keras's keyword arguments.

    Example::

        class MyTrial(det.keras.TFKerasTrial):
            def keras_callbacks(self):
                return [det.keras.callbacks.TensorBoard(update_freq="batch", histogram_freq=1)]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise errors.InvalidConfig(
                "det.keras.callbacks.TensorBoard takes keyword arguments only (as in Determined, "
                f"where the log folder is chosen for you). Received positional: {args!r}."
            )
        user_log_dir = kwargs.pop("log_dir", None)
        if user_log_dir is not None:
            logger.warning("log_dir=%s of det.keras.callbacks.TensorBoard is ignored", user_log_dir)
        self._core = None
        self.workload_end_count = 0
        super().__init__(None, **kwargs)

    def _require_core(self) -> None:
        if self._core is None:
            raise errors.InvalidConfig(
                "det.keras.callbacks.TensorBoard is for TFKerasTrial.keras_callbacks(); with "
                "model.fit() use ckptstore.keras.TensorBoard(core_context, ...) instead."
            )

    # Epochs are workloads here (Determined's translation); Keras's own epoch calls are skipped.
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        pass

    def on_train_workload_begin(
        self, total_batches_trained: int, batches_requested: int | None, logs: dict[str, Any]
    ) -> None:
        self._require_core()
        super().on_epoch_begin(self.workload_end_count, logs)

    def on_train_workload_end(self, total_batches_trained: int, logs: dict[str, Any]) -> None:
        self._require_core()
        super().on_epoch_end(self.workload_end_count, logs)
        self.workload_end_count += 1

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Nothing to add to checkpoints (the logs live under ``tensorboard/``)."""

    def get_state(self) -> dict[str, Any]:
        return {"workload_end_count": self.workload_end_count}

    def load_state(self, state: dict[str, Any]) -> None:
        self.workload_end_count = int(state["workload_end_count"])

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._require_core()
        super().on_train_end(logs)
