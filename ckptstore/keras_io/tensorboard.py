"""``TensorBoard``: Keras's TensorBoard callback, with its logs synced to checkpoint storage."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import tempfile
from typing import Any

import keras

from ckptstore import errors

logger = logging.getLogger(__name__)

#: Logs go to ``<storage>/tensorboard/<trial id>/``.
TENSORBOARD_PREFIX = "tensorboard"


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
        **keras_args: any argument of ``keras.callbacks.TensorBoard``. ``log_dir`` defaults to a
            local temporary folder (removed at the end of training); pass one to keep the logs.

    Example::

        tb = ckptstore.keras.TensorBoard(core_context, histogram_freq=1)
        model.fit(x, y, epochs=5, callbacks=[det_cb, tb])
        # tensorboard --logdir <local copy of s3://bucket/ckpts/tensorboard/1>
    """

    def __init__(self, core_context: Any, **keras_args: Any) -> None:
        self._owns_log_dir = "log_dir" not in keras_args
        if self._owns_log_dir:
            keras_args["log_dir"] = tempfile.mkdtemp(prefix="ckptstore-tb-")
        super().__init__(**keras_args)
        self._core = core_context
        self._is_chief = getattr(core_context.distributed, "rank", 0) == 0
        trial_id = getattr(getattr(core_context.info, "trial", None), "trial_id", None)
        self.storage_key = f"{TENSORBOARD_PREFIX}/{trial_id if trial_id is not None else 'none'}"
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._future: concurrent.futures.Future[None] | None = None

    # ---- keras hooks --------------------------------------------------------------------------
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
        changed: list[str] = []
        stats: dict[str, tuple[int, int]] = {}
        for root, _dirs, files in os.walk(self.log_dir):
            for name in files:
                full = os.path.join(root, name)
                rel = os.path.relpath(full, self.log_dir).replace(os.sep, "/")
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                stats[rel] = (st.st_size, st.st_mtime_ns)
                if self._uploaded.get(rel) != stats[rel]:
                    changed.append(rel)
        if changed:
            self._core.checkpoint.storage.upload(self.log_dir, self.storage_key, paths=changed)
            for rel in changed:
                self._uploaded[rel] = stats[rel]
            logger.debug("Synced %d TensorBoard files to %s", len(changed), self.storage_key)
        return changed

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
