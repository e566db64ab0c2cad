"""``DeterminedCallback``: checkpoints, exact resume, metrics and preemption for ``model.fit()``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any

import keras

from ckptstore import errors
from ckptstore.keras_io import callback_state as state_lib
from ckptstore.keras_io import snapshot as snapshot_lib
from ckptstore.keras_io.checkpoint_writer import CheckpointWriter, SaveJob
from ckptstore.keras_io.mwms_compat import apply_mwms_compat

logger = logging.getLogger(__name__)

#: Folder of the inference SavedModel inside a checkpoint (``model.export()``).
SAVED_MODEL_DIRNAME = "saved_model"
_EXPORT_CHOICES = ("final", "all", "never")


class DeterminedCallback(keras.callbacks.Callback):
    """Adds checkpointing to any storage, exact pause/resume, metric reporting and preemption
    to ``model.fit()``. Include it in the ``callbacks`` list.

    Every checkpoint holds ``model.keras`` (architecture, weights and the full optimizer state),
    ``callback_state.json`` (epoch, ``steps_completed``, ``continue_id``, the state of every
    callback in the ``fit()`` list that has ``get_state``/``load_state``, RNG states) and
    ``metadata.json`` (written by the checkpoint context: ``continue_id``, ``steps_completed``,
    ``epoch``, ``metrics``). The final checkpoint also holds an inference SavedModel in
    ``saved_model/`` (see ``export_saved_model``).

    Saving does not hold training up: the model state is snapshotted in memory (a cheap
    copy-on-write read of every variable) and written and uploaded by a background thread.
    A failed background save raises :class:`~ckptstore.errors.BackgroundUploadError` from
    ``fit()`` at the next epoch end or at the end of training.

    Resuming: if ``checkpoint`` was written with the same ``continue_id``, training continues
    exactly where it stopped: weights, optimizer slots and ``iterations``, the epoch to start
    from (``fit(initial_epoch=...)`` is overridden), ``steps_completed``, stateful callbacks and
    RNG states. Otherwise the checkpoint only provides the starting weights (warm start: fresh
    optimizer, epoch 0). The checkpoint resumed from is protected from checkpoint GC.

    Preemption (SIGTERM/SIGINT through ``core_context.preempt``) is checked at batch ends and
    epoch ends; training then saves and stops. A run preempted in the middle of an epoch
    restarts that epoch from its first batch when resumed (Keras cannot start mid-epoch); runs
    stopped at epoch boundaries resume bit-exactly (with deterministic data order).

    Under ``MultiWorkerMirroredStrategy`` only the chief (rank 0) writes checkpoints; every
    worker restores from the same checkpoint. With several workers the callback also applies
    :func:`~ckptstore.keras_io.mwms_compat.apply_mwms_compat` (Keras 3's ``fit()`` fails under
    a multi-worker strategy without it), so create it before calling ``fit()``.

    Do not combine with ``BackupAndRestore`` or ``ModelCheckpoint``.

    Args:
        core_context: the context from ``ckptstore.core.init()``.
        checkpoint: UUID of the checkpoint to start from, or None. In a trial, usually
            ``core_context.info.latest_checkpoint``.
        continue_id: saved with every checkpoint; equal to the one in ``checkpoint`` means
            "continue that training", different means "warm start". Usually the trial id.
            Must be JSON-able (int or str).
        checkpoint_epochs: save every N epochs; 0 saves only at the end of training and on
            preemption. Default 1.
        train_metrics_report_period: ``"epoch"`` or a number of batches between training
            metric reports. Default ``"epoch"``.
        export_saved_model: ``"final"`` (default) adds ``saved_model/`` (``model.export()``) to
            the final checkpoint, ``"all"`` to every checkpoint (costs an export in the
            training thread each time), ``"never"`` to none.
        preempt_check_period: check for preemption every N batches (and at every epoch end);
            0 checks only at epoch ends. With several workers each check is a small collective
            call. Default 1.

    Example::

        import ckptstore as det

        with det.core.init(storage="s3://bucket/ckpts", trial_id=1) as core_context:
            det_cb = det.keras.DeterminedCallback(
                core_context,
                checkpoint=core_context.info.latest_checkpoint,
                continue_id=core_context.info.trial.trial_id,
            )
            model.fit(x, y, epochs=10, validation_data=(vx, vy), callbacks=[det_cb])
    """

    def __init__(
        self,
        core_context: Any,
        checkpoint: str | None,
        continue_id: int | str,
        *,
        checkpoint_epochs: int = 1,
        train_metrics_report_period: int | str = "epoch",
        export_saved_model: str = "final",
        preempt_check_period: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(checkpoint_epochs, bool) or not isinstance(checkpoint_epochs, int):
            raise errors.InvalidConfig(
                "checkpoint_epochs must be an int >= 0 (0 = save only at the end). "
                f"Received: checkpoint_epochs={checkpoint_epochs!r}"
            )
        if checkpoint_epochs < 0:
            raise errors.InvalidConfig(
                f"checkpoint_epochs must be >= 0. Received: checkpoint_epochs={checkpoint_epochs}"
            )
        if train_metrics_report_period != "epoch" and (
            isinstance(train_metrics_report_period, bool)
            or not isinstance(train_metrics_report_period, int)
            or train_metrics_report_period <= 0
        ):
            raise errors.InvalidConfig(
                "train_metrics_report_period must be 'epoch' or a positive number of batches. "
                f"Received: train_metrics_report_period={train_metrics_report_period!r}"
            )
        if export_saved_model not in _EXPORT_CHOICES:
            raise errors.InvalidConfig(
                f"export_saved_model must be one of {_EXPORT_CHOICES}. "
                f"Received: export_saved_model={export_saved_model!r}"
            )
        if (
            isinstance(preempt_check_period, bool)
            or not isinstance(preempt_check_period, int)
            or preempt_check_period < 0
        ):
            raise errors.InvalidConfig(
                "preempt_check_period must be an int >= 0 (0 = epoch ends only). "
                f"Received: preempt_check_period={preempt_check_period!r}"
            )
        try:
            self._continue_id_json = json.loads(json.dumps(continue_id))
        except (TypeError, ValueError) as exc:
            raise errors.InvalidConfig(
                f"continue_id must be JSON-able (an int or str). Received: {continue_id!r}"
            ) from exc
        if checkpoint is not None and not isinstance(checkpoint, str):
            raise errors.InvalidConfig(
                f"checkpoint must be a checkpoint UUID string or None. Received: {checkpoint!r}"
            )

        self._core = core_context
        self._checkpoint = checkpoint
        self._continue_id = continue_id
        self._checkpoint_epochs = checkpoint_epochs
        self._report_period = train_metrics_report_period
        self._export = export_saved_model
        self._preempt_period = preempt_check_period
        self._is_chief = getattr(core_context.distributed, "rank", 0) == 0
        if getattr(core_context.distributed, "size", 1) > 1:
            # Keras 3's fit() fails under a multi-worker MultiWorkerMirroredStrategy without
            # these fixes; they must be in place before fit() starts (see mwms_compat).
            apply_mwms_compat()

        self._writer: CheckpointWriter | None = None
        self._layout: snapshot_lib.StateLayout | None = None
        self._callbacks: list[Any] = []
        self._pending_callback_states: dict[str, Any] | None = None
        self._loaded = False
        self._pending_save: dict[str, Any] | None = None

        self._steps_completed = 0
        self._last_reported_steps = 0
        self._batch_begin = 0
        self._batches_this_epoch = 0
        self._epochs_completed = 0
        self._saved_steps = 0
        self._saved_in_fit = False
        self._last_epoch_complete = True
        self._last_save_final = False
        self._preempted = False

        #: UUID of the newest checkpoint this callback committed (None before the first).
        self.last_checkpoint: str | None = None
        #: Seconds ``fit()`` was blocked by each save (snapshot + hand-over), chief only.
        self.save_blocked_seconds: list[float] = []
        #: Whether the last ``fit()`` resumed training state (same ``continue_id``).
        self.resumed = False

    # ---- public helpers -----------------------------------------------------------------------
    @property
    def steps_completed(self) -> int:
        """Batches trained so far, including those before a resume."""
        return self._steps_completed

    def wait(self) -> None:
        """Block until every checkpoint handed to the background writer is committed."""
        if self._writer is not None:
            self._writer.wait()

    # ---- keras hooks --------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._callbacks = _fit_callbacks(self)
        self._preempted = False
        self._last_save_final = False
        self._saved_in_fit = False
        self._last_epoch_complete = True
        self._pending_save = None
        self.resumed = False
        self._ensure_optimizer_built()
        if self._checkpoint is not None and not self._loaded:
            self._load(self._checkpoint)
            self._loaded = True
        self._saved_steps = self._steps_completed  # nothing new to save yet
        if self._is_chief:
            if self._layout is None or self._layout.model is not self.model:
                self._layout = snapshot_lib.StateLayout.of(self.model)
            if self._writer is None:
                self._writer = CheckpointWriter(self._core.checkpoint)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._pending_save is not None:
            pending, self._pending_save = self._pending_save, None
            self._save(**pending)
        if self._pending_callback_states is not None:
            self._apply_callback_states(self._pending_callback_states)
            self._pending_callback_states = None
        self._batches_this_epoch = 0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin = batch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        done = max(1, batch - self._batch_begin + 1)
        self._steps_completed += done
        self._batches_this_epoch += done
        period = self._report_period
        if (
            self._is_chief
            and isinstance(period, int)
            and logs
            and self._steps_completed // period > self._last_reported_steps // period
        ):
            self._core.train.report_training_metrics(self._steps_completed, _floats(logs))
            self._last_reported_steps = self._steps_completed
        if (
            self._preempt_period
            and not self._preempted
            and self._steps_completed % self._preempt_period == 0
            and self._core.preempt.should_preempt()
        ):
            logger.info("Preemption requested: stopping after step %d", self._steps_completed)
            self._preempted = True
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.check()
        logs = dict(logs or {})
        if self._is_chief:
            train = {k: v for k, v in logs.items() if not k.startswith("val_")}
            val = {k: v for k, v in logs.items() if k.startswith("val_")}
            if self._report_period == "epoch" and train:
                self._core.train.report_training_metrics(self._steps_completed, _floats(train))
            if val:
                self._core.train.report_validation_metrics(self._steps_completed, _floats(val))
        total_steps = (self.params or {}).get("steps")
        if total_steps:
            complete = self._batches_this_epoch >= total_steps
        else:
            complete = not self._preempted
        self._last_epoch_complete = complete
        self._epochs_completed = epoch + 1 if complete else epoch
        if not self._preempted and self._core.preempt.should_preempt():
            logger.info("Preemption requested: stopping after epoch %d", epoch + 1)
            self._preempted = True
            self.model.stop_training = True
        last_epoch = self._epochs_completed >= (self.params or {}).get("epochs", sys.maxsize)
        periodic = (
            complete and self._checkpoint_epochs > 0 and (epoch + 1) % self._checkpoint_epochs == 0
        )
        if self._preempted or periodic or last_epoch:
            # Saved at the next epoch begin (or train end), once every other callback's
            # on_epoch_end has run: their state and any change they make (e.g. the learning rate
            # ReduceLROnPlateau sets) belong to this checkpoint.
            self._pending_save = {
                "logs": logs,
                "complete": complete,
                "final": last_epoch and not self._preempted,
            }

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        try:
            if self._pending_save is not None:
                pending, self._pending_save = self._pending_save, None
                pending["final"] = not self._preempted
                self._save(**pending)
            trained = self._steps_completed > self._saved_steps
            needs_final = (
                not self._preempted
                and self._export == "final"
                and self._saved_in_fit
                and not self._last_save_final
            )
            if trained or needs_final:
                self._save(
                    dict(logs or {}), complete=self._last_epoch_complete, final=not self._preempted
                )
            if self._writer is not None:
                self._writer.wait()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.model._initial_epoch = None

    # ---- saving -------------------------------------------------------------------------------
    def _save(self, logs: dict[str, Any], *, complete: bool, final: bool) -> None:
        self._saved_steps = self._steps_completed
        self._saved_in_fit = True
        self._last_save_final = final
        if not self._is_chief:
            return
        assert self._writer is not None and self._layout is not None
        started = time.perf_counter()
        snap = snapshot_lib.take_snapshot(self._layout)
        saved_ids = {id(e.variable) for e in self._layout.entries if e.variable is not None}
        state = state_lib.TrainingState(
            epoch=self._epochs_completed,
            steps_completed=self._steps_completed,
            continue_id=self._continue_id_json,
            epoch_complete=complete,
            callbacks={
                key: cb.get_state()
                for key, cb in state_lib.stateful_callbacks(self._callbacks).items()
                if cb is not self
            },
            rng=state_lib.capture_rng(),
            extra_variables=state_lib.capture_extra_variables(self.model, saved_ids),
        )
        extra_dir = tempfile.mkdtemp(prefix="ckptstore-extra-")
        try:
            if self._export == "all" or (final and self._export == "final"):
                self._export_saved_model(os.path.join(extra_dir, SAVED_MODEL_DIRNAME))
            for cb in self._callbacks:
                hook = getattr(cb, "on_checkpoint_end", None)
                if cb is not self and callable(hook):
                    hook(extra_dir)
            metadata = {
                "steps_completed": self._steps_completed,
                "continue_id": self._continue_id_json,
                "epoch": self._epochs_completed,
                "metrics": _floats(logs),
                "framework": f"keras-{keras.__version__}",
                "keras_backend": keras.backend.backend(),
                "final": final,
            }
            job = SaveJob(
                snapshot=snap,
                metadata=metadata,
                files={state_lib.STATE_FILENAME: state.to_json().encode()},
                extra_dir=extra_dir,
                on_done=self._on_committed,
            )
            self._writer.submit(job)
        except BaseException:
            shutil.rmtree(extra_dir, ignore_errors=True)
            raise
        blocked = time.perf_counter() - started
        self.save_blocked_seconds.append(blocked)
        logger.debug("Checkpoint handed to the background writer in %.3f s", blocked)

    def _on_committed(self, uuid: str) -> None:
        self.last_checkpoint = uuid

    def _export_saved_model(self, path: str) -> None:
        try:
            self.model.export(path, verbose=False)
        except TypeError:  # older Keras without verbose=
            self.model.export(path)

    # ---- loading ------------------------------------------------------------------------------
    def _ensure_optimizer_built(self) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None or optimizer.built:
            return
        strategy = getattr(self.model, "distribute_strategy", None)
        if strategy is not None:
            with strategy.scope():
                optimizer.build(self.model.trainable_variables)
        else:
            optimizer.build(self.model.trainable_variables)

    def _load(self, uuid: str) -> None:
        with self._core.checkpoint.restore_path(uuid) as path:
            path = os.fspath(path)
            model_path = os.path.join(path, snapshot_lib.MODEL_FILENAME)
            if not os.path.exists(model_path):
                raise errors.ResumeError(
                    f"Checkpoint {uuid} has no {snapshot_lib.MODEL_FILENAME}; it was not written "
                    "by DeterminedCallback. Pass checkpoint=None or a checkpoint that holds a "
                    "Keras model."
                )
            state = state_lib.read_state(path)
            continuing = state is not None and state.continue_id == self._continue_id_json
            self._load_model_file(uuid, model_path, with_optimizer=continuing)
        protect = getattr(self._core.checkpoint, "protect", None)
        if callable(protect):
            protect(uuid)
        if not continuing:
            logger.info(
                "Warm start from checkpoint %s (its continue_id %r differs from %r): weights "
                "only, optimizer fresh, epoch 0.",
                uuid,
                None if state is None else state.continue_id,
                self._continue_id_json,
            )
            return
        assert state is not None
        self.resumed = True
        self._steps_completed = int(state.steps_completed)
        self._last_reported_steps = self._steps_completed
        self._epochs_completed = int(state.epoch)
        self.model._initial_epoch = int(state.epoch)
        state_lib.restore_rng(state.rng)
        state_lib.restore_extra_variables(self.model, state.extra_variables)
        self._pending_callback_states = dict(state.callbacks)
        if not state.epoch_complete:
            logger.warning(
                "Checkpoint %s was saved in the middle of epoch %d (preemption); that epoch "
                "restarts from its first batch.",
                uuid,
                state.epoch + 1,
            )
        logger.info(
            "Resumed from checkpoint %s: epoch %d, steps_completed %d",
            uuid,
            state.epoch,
            state.steps_completed,
        )

    def _load_model_file(self, uuid: str, model_path: str, *, with_optimizer: bool) -> None:
        from keras.src.saving import saving_lib

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if with_optimizer:
                    self.model.load_weights(model_path)
                else:
                    skip = [self.model.optimizer] if self.model.optimizer is not None else None
                    saving_lib.load_weights_only(self.model, model_path, objects_to_skip=skip)
            except (ValueError, KeyError, OSError) as exc:
                raise errors.ResumeError(
                    f"Could not load checkpoint {uuid} into this model: {exc}. The model "
                    "(layers, shapes) must be the one the checkpoint was saved from."
                ) from exc
        for w in caught:
            text = str(w.message)
            if "Skipping variable loading" in text or "mismatch" in text.lower():
                raise errors.ResumeError(
                    f"Checkpoint {uuid} could not be restored exactly: {text.strip()} Compile "
                    "the model with the same optimizer it was saved with."
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def _apply_callback_states(self, states: dict[str, Any]) -> None:
        targets = {
            key: cb
            for key, cb in state_lib.stateful_callbacks(self._callbacks).items()
            if cb is not self
        }
        for key, value in states.items():
            cb = targets.get(key)
            if cb is None:
                logger.warning(
                    "Checkpoint has state for callback %r but fit() has no such callback; ignored.",
                    key,
                )
                continue
            cb.load_state(value)
        missing = sorted(set(targets) - set(states))
        if missing:
            logger.warning("No saved state for callbacks %s; they start fresh.", missing)


def _floats(logs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in logs.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _fit_callbacks(me: Any) -> list[Any]:
    """The callbacks of the running ``fit()``: found on the ``CallbackList`` calling ``me``.

    Keras gives a callback no handle on its siblings; ``CallbackList.on_train_begin`` is the
    caller, so its ``self`` is looked up a few frames up the stack.
    """
    from keras.callbacks import CallbackList

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, CallbackList) and me in candidate.callbacks:
            return list(candidate.callbacks)
        frame = frame.f_back
    logger.warning(
        "Could not find the fit() callback list; other callbacks' state will not be saved."
    )
    return [me]
