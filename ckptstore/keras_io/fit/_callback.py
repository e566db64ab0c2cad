"""``DeterminedCallback``: checkpoints, exact resume, metrics and preemption for ``model.fit()``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from ckptstore import errors
from ckptstore.keras_io import backend
from ckptstore.keras_io import data as data_pkg
from ckptstore.keras_io.backend import keras
from ckptstore.keras_io.data import _resumable as resumable_data
from ckptstore.keras_io.exporting import _best_effort as best_effort
from ckptstore.keras_io.exporting._checkpoint_exports import CheckpointExports
from ckptstore.keras_io.exporting._policy import ExportPolicy
from ckptstore.keras_io.fit import _callback_state as state_lib
from ckptstore.keras_io.fit import _fit_log, _fit_runs
from ckptstore.keras_io.fit import _keras_callback_state as cb_arrays
from ckptstore.keras_io.fit._final_handoff import FinalHandoff
from ckptstore.keras_io.fit._mwms_compat import apply_mwms_compat
from ckptstore.keras_io.fit._resume import USER_MODEL_NAME, CheckpointRestore
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _layer_states as layer_states
from ckptstore.keras_io.saving import _optimizers as optimizers_lib
from ckptstore.keras_io.saving import _snapshot as snapshot_lib
from ckptstore.keras_io.saving._snapshot import SAVED_MODEL_DIRNAME
from ckptstore.keras_io.saving._writer import CheckpointWriter, SaveJob
from ckptstore.validators import int_at_least

logger = logging.getLogger(__name__)

__all__ = ["SAVED_MODEL_DIRNAME", "USER_MODEL_NAME", "DeterminedCallback"]


class DeterminedCallback(CheckpointRestore, backend.CallbackBase):
    """Adds checkpointing to any storage, exact pause/resume, metric reporting and preemption
    to ``model.fit()``. Include it in the ``callbacks`` list.

    Every checkpoint holds ``model.keras`` (architecture, weights and the full optimizer state),
    ``callback_state.json`` (epoch, ``steps_completed``, ``continue_id``, the state of every
    callback in the ``fit()`` list that has ``get_state``/``load_state``, RNG states) and
    ``metadata.json`` (written by the checkpoint context: ``continue_id``, ``steps_completed``,
    ``epoch``, ``metrics``). The final checkpoint also holds an inference SavedModel in
    ``saved_model/`` (see ``export_saved_model``), exported from the checkpoint's own
    ``model.keras`` (Keras 2: ``model_checkpoint.*`` + ``model_config.json``) by a worker
    process (:mod:`ckptstore.keras_io.exporting`) and verified before the checkpoint commits (a
    model no other process can rebuild, e.g. with classes from ``__main__``, is exported on the
    training thread, with a warning). The full model's config and the SavedModel are best
    effort: when one cannot be made the checkpoint commits without it, ``metadata["missing"]``
    says why and one warning per run names the fix; what resumes training always commits. ``fit()`` never waits for an export: a checkpoint carrying one may
    commit after ``fit()`` returned; :meth:`wait`, reading :attr:`last_checkpoint`, the next
    ``fit()``, leaving ``with ckptstore.core.init(...)`` (``core_context.checkpoint.wait()``)
    and interpreter exit wait for it.

    Saving does not hold training up: the model state is snapshotted in memory (a cheap
    copy-on-write read of every variable) and written and uploaded by a background thread.
    A failed background save raises :class:`~ckptstore.errors.BackgroundUploadError` from
    ``fit()`` at the next epoch end or at the end of training.

    Resuming: if ``checkpoint`` was written with the same ``continue_id``, training continues
    exactly where it stopped: weights, optimizer slots and ``iterations``, the epoch to start
    from (``fit(initial_epoch=...)`` is overridden), ``steps_completed``, stateful callbacks and
    RNG states; on Keras 3 also the optimizers the model holds in its own attributes (a GAN's
    ``d_optimizer``; ``optimizers.json`` says which variables each was built for). Otherwise
    the checkpoint only provides the starting weights (warm start: fresh optimizers, epoch 0). The checkpoint resumed from is protected from checkpoint GC.

    Preemption (SIGTERM/SIGINT through ``core_context.preempt``) is checked at batch ends and
    epoch ends; training then saves at that batch boundary and stops. The resumed run continues
    the interrupted epoch at its next unseen batch, in the same data order, with the epoch's
    metric accumulators, RNG states and callbacks' states, bit-equal to an uninterrupted run
    under ``enable_op_determinism``, on Keras 3 and Keras 2 alike (see
    :mod:`~ckptstore.keras_io.data._resumable` and
    :mod:`~ckptstore.keras_io.data._resumable_keras2` for the inputs this covers; for the others,
    e.g. a Python generator, the interrupted epoch restarts, with a warning at ``fit()`` start).

    Under ``MultiWorkerMirroredStrategy`` only the chief (rank 0) writes checkpoints; every
    worker restores from the same checkpoint. With several workers the callback also applies
    :func:`~ckptstore.keras_io.fit._mwms_compat.apply_mwms_compat` (Keras 3's ``fit()`` fails under
    a multi-worker strategy without it), so create it before calling ``fit()``.

    Do not combine with ``BackupAndRestore`` (both would restore; ``fit()`` warns). A script
    may call ``fit()`` several times (fine-tuning after transfer learning), with one callback
    or a new one per call built the same way: the calls of a run (core context and
    ``continue_id``) are counted per process (:mod:`~ckptstore.keras_io.fit._fit_runs`), each
    checkpoint records which call wrote it, and a re-run passes the calls that finished before
    it without training (see ``_skip_reason``).

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
        export_saved_model: which checkpoints get ``saved_model/`` (``model.export()``):
            ``"final"`` (default: the one at the end of training), ``"every"`` (``"all"`` is
            accepted too), ``"best"`` (better ``val_loss``, else ``loss``, than every earlier
            checkpoint of the run), ``"never"``, or an
            :class:`~ckptstore.keras_io.exporting.ExportPolicy` (e.g. ``"best"`` by another
            metric). A preemption's checkpoint never gets one. Exports run in a worker process
            and are checked against the model's predictions before the commit.
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
        export_saved_model: str | ExportPolicy = "final",
        preempt_check_period: int = 1,
    ) -> None:
        super().__init__()
        backend.check_backend("DeterminedCallback")
        int_at_least("checkpoint_epochs", checkpoint_epochs, 0, hint=" (0 = save only at the end).")
        if train_metrics_report_period != "epoch":
            int_at_least(
                "train_metrics_report_period",
                train_metrics_report_period,
                1,
                hint=" Pass 'epoch' or a number of batches.",
            )
        exports = CheckpointExports(backend.saved_model_export(export_saved_model))
        int_at_least(
            "preempt_check_period", preempt_check_period, 0, hint=" (0 = epoch ends only)."
        )
        self._continue_id_json = _checked_ids(checkpoint, continue_id)
        # this run's fit() calls in this process, whichever callback each was given (_fit_runs)
        self._run, self._token = _fit_runs.run_of(core_context, continue_id), _fit_runs.new_token()

        self._core = core_context
        self._checkpoint = checkpoint
        self._continue_id = continue_id
        self._checkpoint_epochs = checkpoint_epochs
        self._report_period = train_metrics_report_period
        self._exports = exports
        self._preempt_period = preempt_check_period
        self._is_chief = getattr(core_context.distributed, "rank", 0) == 0
        if getattr(core_context.distributed, "size", 1) > 1:
            # Keras 3's fit() fails under a multi-worker MultiWorkerMirroredStrategy without
            # these fixes; they must be in place before fit() starts (see mwms_compat).
            apply_mwms_compat()

        self._writer: CheckpointWriter | None = None
        #: The final checkpoint on its way into the writer's queue (see _final_handoff).
        self._handoff: FinalHandoff | None = None
        self._handed_over = False
        self._layout: snapshot_lib.StateLayout | keras2_format.Keras2Layout | None = None
        self._layout_optimizer: Any = None  # model.optimizer when _layout was built
        #: Why the export worker cannot rebuild the model (exported in-process); None: it can.
        self._export_blocker: str | None = None
        self._callbacks: list[Any] = []
        self._pending_callback_states: dict[str, Any] | None = None
        self._loaded = False
        self._pending_save: dict[str, Any] | None = None

        self._steps_completed = 0
        self._last_reported_steps = 0
        self._batch_begin = 0
        self._batches_this_epoch = 0
        self._short_last_execution = False  # see on_train_batch_end
        self._epochs_completed = 0
        self._saved_steps = 0
        self._saved_in_fit = False
        self._last_epoch_complete = True
        self._last_save_final = False
        self._preempted = False
        #: Index of the running fit() call of this callback (a script may call fit() again).
        self._fit_call = -1
        #: This fit() trains nothing (see _skip_reason).
        self._skipping = False
        #: History of each finished fit() call (saved), and those a checkpoint read holds.
        self._fit_histories: list[Any] = []
        self._saved_histories: list[Any] = []
        self._data: resumable_data.ResumableData | None = None
        self._data_seed = 0
        self._resume_batch = 0
        self._resume_metrics: list[Any] | None = None
        self._resumed_rate: tuple[Any, Any] | None = None  # see _reassert_resumed_rate
        self._boundary_pending = False
        self._saved_mid_epoch = False

        self._last_checkpoint: str | None = None
        self._fitlog = _fit_log.FitLog.quiet()
        #: Seconds ``fit()`` was blocked by each save (snapshot + hand-over), chief only.
        self.save_blocked_seconds: list[float] = []
        #: Whether the last ``fit()`` resumed training state (same ``continue_id``).
        self.resumed = False
        self._epoch = 0
        self._user_saved_dir: str | None = None
        #: The status and a subclass's save_model already ran for the pending save.
        self._save_begun = False

    # ---- public helpers -----------------------------------------------------------------------
    @property
    def steps_completed(self) -> int:
        """Batches trained so far, including those before a resume."""
        return self._steps_completed

    @property
    def last_checkpoint(self) -> str | None:
        """UUID of the newest checkpoint this callback committed (None before the first);
        waits for checkpoints still being written (e.g. exported) after ``fit()`` returned."""
        self._exports.wait()
        return self._last_checkpoint

    def wait(self) -> None:
        """Block until every checkpoint handed to the background writer is committed."""
        self._exports.wait()
        if self._writer is not None:
            self._writer.wait()

    # ---- keras hooks --------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._take_over_run()
        self._fit_call += 1
        skip = self._skip_reason()
        self._skipping = skip is not None
        if skip is not None:  # zero epochs: fit() returns at once, nothing is saved
            keras2_format.set_initial_epoch(self.model, int(self.params.get("epochs") or 0))
            logger.info("fit() call %d trains nothing: %s.", self._fit_call + 1, skip)
            self._callbacks = _fit_runs.fit_callbacks(self)
            self._hand_over_run()
            return
        self._fitlog = _fit_log.FitLog(self.params, self._core, self._checkpoint, self._is_chief)
        self._callbacks = _fit_runs.fit_callbacks(self)
        _fit_log.warn_second_restorer(self._callbacks, backend.keras)
        self._boundary_pending = False
        self._saved_mid_epoch = False
        self._resume_batch = 0
        self._resume_metrics = None
        self._data_seed = resumable_data.default_seed()
        self._short_last_execution = resumable_data.epoch_ends_with_data(self.model)
        # Mid-epoch resume hooks into the fit loop (Keras 3's epoch iterator, Keras 2's
        # DataHandler); None, after a warning, for inputs a cut epoch restarts with.
        self._data = data_pkg.for_running_keras().attach(
            self.model,
            seed=self._data_seed,
            distributed_size=getattr(self._core.distributed, "size", 1),
            on_boundary=self._at_batch_boundary,
        )
        self._last_save_final = False
        self._saved_in_fit = False
        self._last_epoch_complete = True
        self._pending_save = None
        self._save_begun = False
        self.resumed = False
        # a model Keras's TensorFlow loop builds in its first step: its variables now
        data_pkg.for_running_keras().build_from_fit_data(self.model)
        self._ensure_optimizer_built()
        if self._checkpoint is not None and not self._loaded:
            self._load(self._checkpoint)
            self._loaded = True
        self._hand_over_run()
        self._saved_steps = self._steps_completed  # nothing new to save yet
        if self._is_chief:
            # a new model, or one recompiled since the last fit() (fine-tuning: a new optimizer)
            optimizer = getattr(self.model, "optimizer", None)
            if self._layout is None or (self._layout.model, self._layout_optimizer) != (
                self.model,
                optimizer,
            ):
                self._layout = keras2_format.layout_of(self.model)
                self._layout_optimizer = optimizer
                self._export_blocker = best_effort.export_blocker(self._layout)
            snapshot_lib.prepare_buffers(self._layout)  # PyTorch: the snapshot's memory
            if self._writer is None or self._writer.closed:
                self._writer = CheckpointWriter(self._core.checkpoint)
            if self._export_blocker is None:  # see _save
                self._exports.prestart()
            if self._handoff is not None:  # an earlier fit() that did not reach its end
                self._handoff.stop()
            self._handed_over = False
            self._handoff = (
                FinalHandoff(self._writer) if self._exports.policy.mode != "never" else None
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        if self._pending_save is not None:
            pending, self._pending_save = self._pending_save, None
            self._save(**pending)
        # in this fit()'s numbering (an earlier fit() call of the script counted its own)
        self._epochs_completed = epoch
        self._set_status("training")
        if self._pending_callback_states is not None:
            self._apply_callback_states(self._pending_callback_states)
            self._pending_callback_states = None
        start, self._resume_batch = self._resume_batch, 0
        if self._data is not None:
            self._data.begin_epoch(epoch, start)
        if self._resume_metrics is not None:
            # fit() has just reset the metrics; the interrupted epoch's accumulators go back
            spec = None if self._data is None else self._data.element_spec
            data_pkg.for_running_keras().restore_metrics(self.model, self._resume_metrics, spec)
            self._resume_metrics = None
        self._batches_this_epoch = start

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin = batch
        self._reassert_resumed_rate()  # done already when the data hooks' boundary ran first

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        snapshot_lib.settle_buffers(self._layout)  # PyTorch: the last snapshot's copy ends
        done = max(1, batch - self._batch_begin + 1)
        # compile(steps_per_execution=k): Keras 3 reports an epoch's last execution as k
        # batches even when the epoch's data had fewer left
        total = (self.params or {}).get("steps") or getattr(self._data, "num_batches", None)
        if total and self._short_last_execution:
            done = max(1, min(done, total - self._batches_this_epoch))
        self._steps_completed += done
        self._batches_this_epoch += done
        period = self._report_period
        if (
            self._is_chief
            and isinstance(period, int)
            and logs
            and self._steps_completed // period > self._last_reported_steps // period
        ):
            self._report("training", self._epoch + 1, logs)
            self._last_reported_steps = self._steps_completed
        if (
            self._preempt_period
            and not self._preempted
            and self._steps_completed % self._preempt_period == 0
            and self._core.preempt.should_preempt()
        ):
            logger.info("Preemption requested: stopping after step %d", self._steps_completed)
            self._preempted = True
            self._boundary_pending = True  # saved once every callback has seen this batch
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.check()
        logs = dict(logs or {})
        # An epoch cut by a preemption and saved at its batch boundary is reported by the run
        # that finishes it; its partial logs (and the validation Keras still runs on the way
        # out) would add a second, partial validation for the same epoch.
        if self._is_chief and not self._saved_mid_epoch:
            train = {k: v for k, v in logs.items() if not k.startswith("val_")}
            if self._report_period == "epoch" and train:
                self._report("training", epoch + 1, train)
            if (self.params or {}).get("epochs"):
                self._core.train.report_progress((epoch + 1) / self.params["epochs"])
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
        if self._saved_mid_epoch:
            return  # the interrupted epoch was saved at its batch boundary
        if self._preempted or periodic or last_epoch:
            # Committed at the next epoch begin (or train end), once every other callback's
            # on_epoch_end has run: their state (Keras's History gets this epoch's logs after
            # this hook) and any change they make (e.g. the learning rate ReduceLROnPlateau
            # sets) belong to this checkpoint.
            self._pending_save = {
                "logs": logs,
                "complete": complete,
                "final": last_epoch and not self._preempted,
            }
            if not self._model_may_change_after_me():
                # Determined saves inside on_epoch_end: when nothing after this callback can
                # change the model, its visible part (status, a subclass's save_model) runs here.
                self._begin_save()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._set_status("validating")

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        # Determined reports validation metrics here: they are final once evaluation ends. An
        # epoch cut by a preemption and saved at its batch boundary is left to the run that
        # finishes it (Keras still validates on the way out; see on_epoch_end).
        if self._is_chief and logs and not self._saved_mid_epoch:
            val = {k if k.startswith("val_") else f"val_{k}": v for k, v in logs.items()}
            self._report("validation", self._epoch + 1, val)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._skipping:
            keras2_format.set_initial_epoch(self.model, None)
            if not self._preempted:
                self._history_of_finished_call()
            self._hand_over_run()
            return
        if self._pending_callback_states is not None:
            # a resume past the call's last epoch runs no epoch: the callbacks' states (History's
            # epochs and metrics, what fit() returns) are restored here instead
            self._apply_callback_states(self._pending_callback_states)
            self._pending_callback_states = None
        try:
            if self._pending_save is not None:
                pending, self._pending_save = self._pending_save, None
                pending["final"] = not self._preempted
                self._save(**pending)
            trained = self._steps_completed > self._saved_steps
            needs_final = (
                not self._preempted
                and self._exports.policy.mode == "final"
                and self._saved_in_fit
                and not self._last_save_final
            )
            if trained or needs_final:
                self._save(
                    dict(logs or {}), complete=self._last_epoch_complete, final=not self._preempted
                )
            if self._writer is not None and self._exports.submitted:
                # fit() does not wait for SavedModel exports (see the class docstring).
                handed = self._handoff if self._handed_over else None
                writer, self._writer = handed or self._writer, None
                self._exports.detach(writer, self._core.checkpoint)
            elif self._writer is not None:
                self._writer.wait()
            self._set_status("finishing")
            if not self._preempted:
                self._record_history()
            self._hand_over_run()
        finally:
            handoff, self._handoff = self._handoff, None
            if handoff is not None and not self._handed_over:
                handoff.stop()
                handoff = None
            if self._writer is not None:  # not detached: an error on the way
                (handoff or self._writer).close()
                self._writer = None
                self._exports.close()
            snapshot_lib.release_buffers(self._layout)
            data, self._data = self._data, None  # the fit loop's iterator goes with fit()
            if data is not None and hasattr(data, "release"):
                data.release()
            keras2_format.set_initial_epoch(self.model, None)
            self._fitlog.end(self._checkpoint if self.resumed else None, self._fit_call)

    # ---- Determined's override hooks and reporting -----------------------------------------------
    def save_model(self, model: keras.Model, path: str, distributed: Any) -> None:
        """Save ``model`` to ``path`` (Determined's hook; subclass it to change how the model
        is saved). Called on every worker when a subclass overrides it, with ``path`` =
        ``<checkpoint>/model_checkpoint``; the chief's files go into the checkpoint.

        The default writes ``<path>.weights.h5`` (Keras weights); the callback itself does not
        need it: every checkpoint also holds ``model.keras`` with the optimizer state.
        """
        model.save_weights(_weights_file(path))

    def load_model(self, model: keras.Model, path: str, distributed: Any) -> None:
        """Load ``model`` from ``path`` (``<checkpoint>/model_checkpoint``; Determined's hook).
        Called instead of the built-in restore of ``model.keras`` when a subclass overrides it.
        The default reads what :meth:`save_model` wrote, else the checkpoint's ``model.keras``."""
        weights = _weights_file(path)
        if not os.path.exists(weights):
            weights = os.path.join(os.path.dirname(path), snapshot_lib.MODEL_FILENAME)
        model.load_weights(weights)

    def _overrides(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(DeterminedCallback, hook)

    def _run_user_save_model(self) -> None:
        """A subclass's save_model, in the training thread, on every worker (Keras's
        multi-worker saving needs all of them); only the chief's files are kept."""
        folder = tempfile.mkdtemp(prefix="ckptstore-user-save-")
        try:
            self.save_model(
                self.model, os.path.join(folder, USER_MODEL_NAME), self._core.distributed
            )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if self._is_chief:
            self._user_saved_dir = folder
        else:
            shutil.rmtree(folder, ignore_errors=True)

    def _set_status(self, status: str) -> None:
        if self._is_chief:
            self._core.train.set_status(status)

    def _report(self, group: str, epochs: int, logs: dict[str, Any]) -> None:
        """Report ``logs`` as Determined does: without Keras's ``batch``/``size`` entries, with
        ``epochs`` and ``batches``."""
        metrics = {k: v for k, v in _floats(logs).items() if k not in ("batch", "size")}
        metrics.setdefault("epochs", epochs)
        metrics.setdefault("batches", self._steps_completed)
        self._core.train.report_metrics(group, self._steps_completed, metrics)

    # ---- saving -------------------------------------------------------------------------------
    def _at_batch_boundary(self) -> None:
        """Runs before any other callback's epoch end once a batch after a preemption request
        is done: saves the middle of the epoch (an epoch that is complete anyway takes the
        usual epoch-end path)."""
        self._reassert_resumed_rate()
        if not self._boundary_pending:
            return
        self._boundary_pending = False
        if self._data is None or self._batches_this_epoch >= self._data.num_batches:
            return
        self._save({}, complete=False, final=False)
        self._saved_mid_epoch = True

    def _model_may_change_after_me(self) -> bool:
        """Whether a callback after this one in ``fit()``'s list has its own ``on_epoch_end``
        (Keras's History and progress bar aside: they only record logs)."""
        if self not in self._callbacks:
            return True
        later = self._callbacks[self._callbacks.index(self) + 1 :]
        base = keras.callbacks.Callback.on_epoch_end
        passive = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
        return any(
            type(cb).on_epoch_end is not base and not isinstance(cb, passive) for cb in later
        )

    def _begin_save(self) -> None:
        """What Determined's users see of a save: the status, then a subclass's save_model."""
        self._save_begun = True
        self._set_status("checkpointing")
        if self._overrides("save_model"):
            self._run_user_save_model()

    def _save(self, logs: dict[str, Any], *, complete: bool, final: bool) -> None:
        self._saved_steps = self._steps_completed
        self._saved_in_fit = True
        self._last_save_final = final
        if not self._save_begun:
            self._begin_save()
        self._save_begun = False
        if not self._is_chief:
            return
        assert self._writer is not None and self._layout is not None
        started = time.perf_counter()
        # Everything fit() must wait for is taken here, on the training thread: the weights
        # snapshot first, then the state that goes with them; the writer thread does the rest.
        snap = keras2_format.snapshot_of(self._layout)
        state, arrays = self._training_state(complete)
        metadata = self._checkpoint_metadata(logs, final=final)
        # The export runs in a worker process (Keras 2: a Keras 2 worker) from the checkpoint's
        # files, unless no other process can rebuild the model (no config, classes from
        # __main__): then _export_on_this_thread exports the live model.
        export_hook = (
            None
            if self._export_blocker is not None
            else self._exports.hook(
                final=final,
                preempted=self._preempted,
                metrics=_floats(logs),
                config_json=self._layout.config_json or "null",
                keras2=backend.IS_KERAS2,
                metadata=metadata,
            )
        )
        files = {}
        if arrays:
            files[cb_arrays.ARRAYS_FILENAME] = cb_arrays.arrays_to_bytes(arrays)
        own = {} if backend.IS_KERAS2 else optimizers_lib.attribute_optimizers(self.model)
        if own:  # what each was built for: a resume builds it so model.keras fills its slots
            record = optimizers_lib.describe(self.model, own)
            files[optimizers_lib.OPTIMIZERS_FILENAME] = json.dumps(record).encode()
        extra_dir = self._user_saved_dir or tempfile.mkdtemp(prefix="ckptstore-extra-")
        self._user_saved_dir = None
        try:
            if self._data is not None:
                batches = 0 if complete else self._batches_this_epoch
                state.data = self._data.snapshot(self._epochs_completed, batches, extra_dir)
            state_json, state_cuts = state.to_json_with_cuts()
            files[state_lib.STATE_FILENAME] = state_json.encode()
            exported_here = self._export_blocker is not None and self._exports.export_here(
                self.model,
                os.path.join(extra_dir, SAVED_MODEL_DIRNAME),
                final=final,
                preempted=self._preempted,
                metrics=_floats(logs),
                metadata=metadata,
                why=self._export_blocker,
            )
            for cb in self._callbacks:
                hook = getattr(cb, "on_checkpoint_end", None)
                if cb is not self and callable(hook):
                    hook(extra_dir)
            metadata["saved_model"] = export_hook is not None or exported_here
            # the policy's state after this checkpoint's export decision, for a resumed run
            metadata.update(self._exports.policy.metadata())
            job = SaveJob(
                snapshot=snap,
                metadata=metadata,
                files=files,
                extra_dir=extra_dir,
                on_done=self._on_committed,
                before_commit=export_hook,
                cuts={state_lib.STATE_FILENAME: state_cuts},
            )
            self._submit(job, detached=final and export_hook is not None)
            self._fitlog.saves += 1
        except BaseException:
            shutil.rmtree(extra_dir, ignore_errors=True)
            raise
        blocked = time.perf_counter() - started
        self.save_blocked_seconds.append(blocked)
        logger.debug("Checkpoint handed to the background writer in %.3f s", blocked)

    def _submit(self, job: SaveJob, *, detached: bool) -> None:
        """Hand ``job`` to the writer. ``detached``: fit() does not wait for its commit (the
        final checkpoint with an export, see on_train_end), nor, when earlier checkpoints fill
        the writer's queue, for a place in it (see _final_handoff)."""
        assert self._writer is not None
        if detached and self._handoff is not None and self._writer.busy:
            self._writer.check()  # a failure known now is raised from fit()
            self._handoff.hand_over(job)
            self._handed_over = True
        else:
            self._writer.submit(job)

    def _training_state(self, complete: bool) -> tuple[state_lib.TrainingState, dict[str, Any]]:
        """The checkpoint's ``callback_state.json`` contents besides the data position, and the
        arrays split out of the callbacks' states (saved next to it as one file)."""
        assert self._layout is not None
        saved_ids = {id(e.variable) for e in self._layout.entries if e.variable is not None}
        # one arrays file for the callbacks' arrays and the stateful RNN layers' states
        parts, arrays = cb_arrays.split_arrays(
            {
                "callbacks": {
                    key: cb.get_state()
                    for key, cb in state_lib.stateful_callbacks(self._callbacks).items()
                    if cb is not self
                },
                "layer_states": layer_states.capture(self.model) or None,
            }
        )
        state = state_lib.TrainingState(
            epoch=self._epochs_completed,
            steps_completed=self._steps_completed,
            continue_id=self._continue_id_json,
            epoch_complete=complete,
            callbacks=parts["callbacks"],
            rng={**state_lib.capture_rng(), **keras2_format.capture_layer_rng(self.model)},
            extra_variables=state_lib.capture_extra_variables(self.model, saved_ids),
            layer_states=parts["layer_states"],
            fit_call=self._fit_call,
            fit_histories=list(self._fit_histories) or None,
            metrics_variables=(
                None
                if complete or self._data is None
                else resumable_data.capture_metrics(self.model)
            ),
        )
        return state, arrays

    def _checkpoint_metadata(self, logs: dict[str, Any], *, final: bool) -> dict[str, Any]:
        """The checkpoint's ``metadata.json`` (Determined's keys plus what a resume checks,
        and ``missing``: the secondary artifacts it lacks, and why)."""
        metadata = {
            "steps_completed": self._steps_completed,
            "continue_id": self._continue_id_json,
            "epoch": self._epochs_completed,
            "metrics": _floats(logs),
            "framework": backend.FRAMEWORK,
            "keras_version": backend.keras.__version__,
            "keras_backend": backend.backend_name(),
            "final": final,
            "full_model": True,
            # how many workers trained it (TF_CONFIG / Ray Train workers; 1 alone)
            "distributed": {"size": int(getattr(self._core.distributed, "size", 1))},
        }
        shortfall = best_effort.config_shortfall(self._layout)
        if shortfall:
            self._exports.shortfalls.record(metadata, best_effort.MODEL_CONFIG, shortfall)
        return metadata

    def _on_committed(self, uuid: str) -> None:
        self._last_checkpoint = uuid
        if self._run is not None and self._run.owner == self._token:
            self._run.last_committed = uuid
        self._fitlog.committed.append(uuid)


def _checked_ids(checkpoint: Any, continue_id: Any) -> Any:
    """``continue_id`` as JSON gives it back; InvalidConfig for a bad one or ``checkpoint``."""
    try:
        continue_id_json = json.loads(json.dumps(continue_id))
    except (TypeError, ValueError) as exc:
        raise errors.InvalidConfig(
            f"continue_id must be JSON-able (an int or str). Received: {continue_id!r}"
        ) from exc
    if checkpoint is not None and not isinstance(checkpoint, str):
        raise errors.InvalidConfig(
            f"checkpoint must be a checkpoint UUID string or None. Received: {checkpoint!r}"
        )
    return continue_id_json


def _weights_file(path: str) -> str:
    """Keras 3 saves weights only to ``*.weights.h5``; Determined's paths have no suffix."""
    return path if path.endswith(".weights.h5") else path + ".weights.h5"


def _floats(logs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in logs.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out
