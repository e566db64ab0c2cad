"""Restoring a ``DeterminedCallback`` from a checkpoint: the model's weights and optimizer
state, then (same ``continue_id``) the run's counters, RNGs, callbacks' states and its place in
the epoch. ``DeterminedCallback`` takes these methods from :class:`CheckpointRestore`; the
callback's other half (:mod:`~ckptstore.keras_io.fit._callback`) saves what is read here.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from ckptstore import errors
from ckptstore.keras_io import backend
from ckptstore.keras_io.fit import _callback_state as state_lib
from ckptstore.keras_io.fit import _fit_log, _fit_runs
from ckptstore.keras_io.fit import _keras_callback_state as cb_arrays
from ckptstore.keras_io.loading._into_model import raise_partial_load
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _layer_states as layer_states
from ckptstore.keras_io.saving import _optimizers as optimizers_lib
from ckptstore.keras_io.saving import _snapshot as snapshot_lib
from ckptstore.keras_io.saving import _weights_view as weights_view
from ckptstore.keras_io.saving._snapshot import SAVED_MODEL_DIRNAME

logger = logging.getLogger(__name__)

#: What Determined's save_model/load_model hooks get as ``path`` inside the checkpoint.
USER_MODEL_NAME = "model_checkpoint"

__all__ = ["USER_MODEL_NAME", "CheckpointRestore"]


class CheckpointRestore:
    """The restoring half of ``DeterminedCallback`` (a mixin: it reads and sets the callback's
    counters, its data hooks, exports policy and pending callback states)."""

    def _skip_reason(self) -> str | None:
        """Why the ``fit()`` call starting now must train nothing, or None.

        A script may call ``fit()`` several times with one callback (train a head on a frozen
        base, unfreeze, recompile, ``fit()`` again; or ``fit(epochs=1)`` in a loop). Each
        checkpoint records which call wrote it (``fit_call``). After a preemption the script
        usually runs on to its next ``fit()``: that call trains nothing (it would train a batch
        and save it as the run's latest checkpoint). A re-run of the script passes every call
        that had finished before the checkpoint without training, and the call that wrote it
        restores it and continues.
        """
        if self._preempted:
            return "training was preempted in an earlier fit() call of this process"
        if self._checkpoint is None or self._loaded:
            return None
        saved = self._saved_fit_call(self._checkpoint)
        if saved > self._fit_call:
            return (
                f"checkpoint {self._checkpoint} was written by fit() call {saved + 1}; this "
                "call finished before it"
            )
        return None

    def _take_over_run(self) -> None:
        """At a ``fit()`` start: continue this run's calls from where the previous callback of
        the run in this process left them (a script may give each ``fit()`` a new
        ``DeterminedCallback``; see :mod:`~ckptstore.keras_io.fit._fit_runs`)."""
        run = self._run
        if run is None or run.owner in (0, self._token):
            return
        self._fit_call = run.fit_call
        self._preempted = self._preempted or run.preempted
        if not _fit_runs.follows_run(run, self._checkpoint, self.model):
            return  # an explicit restore of another checkpoint: read at this call
        self._checkpoint, self._loaded = run.checkpoint, run.loaded
        self._steps_completed = run.steps_completed
        self._last_reported_steps = run.last_reported_steps
        self._fit_histories = list(run.fit_histories)
        self._saved_histories = list(run.saved_histories)
        self._exports.policy.resume_from(run.export_state)

    def _hand_over_run(self) -> None:
        """Record this callback's place in the run for a later ``fit()`` call's callback."""
        run = self._run
        if run is None:
            return
        run.owner = self._token
        run.fit_call, run.preempted = self._fit_call, self._preempted
        run.checkpoint, run.loaded = self._checkpoint, self._loaded
        run.steps_completed = self._steps_completed
        run.last_reported_steps = self._last_reported_steps
        run.fit_histories = list(self._fit_histories)
        run.saved_histories = list(self._saved_histories)
        run.export_state = self._exports.policy.metadata()
        run.model = _fit_runs.model_ref(self.model)
        if self._last_checkpoint is not None:
            run.last_committed = self._last_checkpoint

    def _saved_fit_call(self, uuid: str) -> int:
        """``fit_call`` of checkpoint ``uuid`` when it continues this run (else 0); reads only
        its ``callback_state.json``."""
        select = lambda relpath: relpath == state_lib.STATE_FILENAME  # noqa: E731
        with self._core.checkpoint.read_in_place(uuid, selector=select) as path:
            state = state_lib.read_state(os.fspath(path))
            # Protected for the run while this read still pins it: the restore's reads then
            # add no pin of their own (one registry write, not a pin and unpin per read).
            self._protect(uuid)
        if state is None or state.continue_id != self._continue_id_json:
            return 0
        self._saved_histories = list(state.fit_histories or [])
        return int(state.fit_call)

    def _history_of_finished_call(self) -> None:
        """Give a ``fit()`` call passed on a re-run (see :meth:`_skip_reason`) the ``History``
        it had (``initial_epoch=history.epoch[-1]`` and ``history.history[...]`` read it)."""
        saved = self._saved_histories
        if self._fit_call >= len(saved):
            return
        for cb in self._callbacks:
            if isinstance(cb, backend.keras.callbacks.History):
                cb_arrays.with_state(cb).load_state(saved[self._fit_call])

    def _record_history(self) -> None:
        """Keep this finished ``fit()`` call's ``History`` for the checkpoints after it."""
        for cb in self._callbacks:
            if isinstance(cb, backend.keras.callbacks.History):
                self._fit_histories.append(cb_arrays.with_state(cb).get_state())
                return
        self._fit_histories.append({"epoch": [], "history": {}})

    def _protect(self, uuid: str) -> None:
        """Keep checkpoint ``uuid`` from checkpoint GC while the run's context is open."""
        protect = getattr(self._core.checkpoint, "protect", None)
        if callable(protect):
            protect(uuid)

    def _ensure_optimizer_built(self) -> None:
        _build_by_tracing_train_step(self.model, self._data)  # its variables first
        keras2_format.build_optimizer(self.model)

    def _load(self, uuid: str) -> None:
        self._set_status("restoring")
        user_load = self._overrides("load_model")
        # Resuming never reads the SavedModel: not fetched, copied or checked (a subclass's
        # load_model may read anything).
        select = None if user_load else (lambda r: r.split("/", 1)[0] != SAVED_MODEL_DIRNAME)
        # A deduplicated model.keras on a local store is read in place from its chunks.
        read_view = not user_load and not backend.IS_KERAS2
        views: dict[str, Any] = {snapshot_lib.MODEL_FILENAME: None} if read_view else {}
        with self._core.checkpoint.read_in_place(uuid, selector=select, views=views) as path:
            path = os.fspath(path)
            model_path = os.path.join(path, snapshot_lib.MODEL_FILENAME)
            model_view = views.get(snapshot_lib.MODEL_FILENAME)
            keras2_weights = keras2_format.has_weights(path)
            has_model = model_view is not None or os.path.exists(model_path)
            if not user_load and not keras2_weights and not has_model:
                raise errors.ResumeError(
                    f"Checkpoint {uuid} has no {snapshot_lib.MODEL_FILENAME}; it was not written "
                    "by DeterminedCallback. Pass checkpoint=None or a checkpoint that holds a "
                    "Keras model."
                )
            state = state_lib.read_state(path)
            continuing = state is not None and state.continue_id == self._continue_id_json
            if user_load:  # a subclass's load_model decides what is restored, as in Determined
                self.load_model(
                    self.model, os.path.join(path, USER_MODEL_NAME), self._core.distributed
                )
            elif backend.IS_KERAS2 or (keras2_weights and not has_model):
                try:
                    keras2_format.load_into(self.model, path, with_optimizer=continuing)
                except keras2_format.OtherModelError as exc:  # TF's text may list weight values
                    raise _fit_log.other_model(uuid, path, self.model, self._core) from exc
            else:
                self._load_model_file(uuid, model_path, with_optimizer=continuing, view=model_view)
            if continuing:
                assert state is not None
                arrays_path = os.path.join(path, cb_arrays.ARRAYS_FILENAME)
                if os.path.exists(arrays_path):
                    arrays = cb_arrays.arrays_from_file(arrays_path)
                    state.callbacks = cb_arrays.join_arrays(state.callbacks, arrays)
                    state.layer_states = cb_arrays.join_arrays(state.layer_states, arrays)
                if state.data is not None and self._data is not None:
                    self._resume_batch = self._data.restore(state.data, path)
        self._protect(uuid)
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
        self._continue_from(uuid, state)

    def _continue_from(self, uuid: str, state: state_lib.TrainingState) -> None:
        """Continue the run that wrote checkpoint ``uuid`` (same ``continue_id``): its step and
        epoch counters, RNGs, extra variables, callbacks' states and place in the epoch."""
        self.resumed = True
        self._exports.resume_from(self._core.checkpoint, uuid)
        self._steps_completed = int(state.steps_completed)
        self._last_reported_steps = self._steps_completed
        self._epochs_completed = int(state.epoch)
        keras2_format.set_initial_epoch(self.model, int(state.epoch))
        state_lib.restore_rng(state.rng)
        keras2_format.restore_layer_rng(self.model, state.rng)
        state_lib.restore_extra_variables(self.model, state.extra_variables)
        layer_states.restore(self.model, state.layer_states, uuid)
        self._pending_callback_states = dict(state.callbacks)
        self._fit_histories = list(state.fit_histories or [])
        if not state.epoch_complete:
            self._resumed_rate = _learning_rate_of(self.model)
        if not state.epoch_complete and self._resume_batch:
            self._resume_metrics = state.metrics_variables
            self._batches_this_epoch = self._resume_batch
        elif not state.epoch_complete:
            self._resume_batch = 0
            logger.warning(
                "Checkpoint %s was saved in the middle of epoch %d (preemption); that epoch "
                "restarts from its first batch.",
                uuid,
                state.epoch + 1,
            )
        epochs = (self.params or {}).get("epochs")
        _fit_log.log_resumed(uuid, state, self._resume_batch, self._core, epochs)

    def _reassert_resumed_rate(self) -> None:
        """Before the first batch of a resumed cut epoch (after every callback's
        ``on_epoch_begin``): give the optimizer back the learning rate the interrupted epoch
        ran with. fit() calls ``on_epoch_begin`` for that epoch a second time, and a schedule
        that works from the current rate (``LearningRateScheduler(lambda epoch, lr: lr * f)``)
        would apply its change again."""
        pending, self._resumed_rate = self._resumed_rate, None
        if pending is not None:
            variable, value = pending
            variable.assign(value)

    def _load_model_file(
        self, uuid: str, model_path: str, *, with_optimizer: bool, view: Any = None
    ) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if with_optimizer:  # a GAN's own optimizers, built as when it was saved
                    optimizers_lib.build_attribute_optimizers(
                        self.model, os.path.dirname(model_path)
                    )
                weights_view.load_weights(
                    self.model, model_path if view is None else view, with_optimizer=with_optimizer
                )
            except (ValueError, KeyError, OSError) as exc:
                # Keras' message holds weight values: a summary of both models instead.
                saved = model_path if view is None else view  # the file read, not a path to it
                raise _fit_log.other_model(uuid, saved, self.model, self._core) from exc
        raise_partial_load(
            caught,
            lambda text: errors.ResumeError(
                f"Checkpoint {uuid} could not be restored exactly: {text} Compile the model "
                "with the same optimizer it was saved with."
            ),
        )
        if with_optimizer:
            optimizers_lib.raise_if_unrestored(self.model, f"checkpoint {uuid}")

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


def _learning_rate_of(model: Any) -> tuple[Any, Any] | None:
    """``(variable, value)`` of the learning rate of ``model.optimizer``, or None when it has
    none to assign (no optimizer, a ``LearningRateSchedule`` computed from the step)."""
    rate = getattr(getattr(model, "optimizer", None), "learning_rate", None)
    if not (hasattr(rate, "assign") and hasattr(rate, "numpy")):
        return None
    return rate, rate.numpy()


def _build_by_tracing_train_step(model: Any, data: Any) -> None:
    """Create the variables of a model whose own ``train_step`` builds parts of it (keras-io's
    SimCLR: an encoder without an ``Input``, first called inside the step, and the optimizers
    of its ``compile()`` built for its weights), at ``on_train_begin``, before the callback
    builds ``model.optimizer`` and restores a checkpoint.

    Keras's TensorFlow loop builds them when it traces the first step, after
    ``on_train_begin``: a resume found fewer weights than the checkpoint holds (an IndexError
    where ``fit()`` without the callback trains on), and ``model.optimizer`` (unused by such a
    step, built by the callback) was built for part of the weights, which a model built whole
    to load the checkpoint into does not match. ``train_step`` is traced here once on the fit
    data's batch spec, as Keras traces it: layers and optimizers build, and nothing the trace
    records runs (no update, no metric, no seed drawn). A step that cannot be traced on the
    spec (one reading a static batch size) is left to Keras. Keras's own ``train_step`` is
    built from the data already (``build_from_fit_data``). TensorFlow only: the JAX and
    PyTorch loops build the model before the callbacks start."""
    own_step = type(model).train_step is backend.keras.Model.train_step
    spec = getattr(data, "element_spec", None)
    if own_step or spec is None or backend.backend_name() != "tensorflow":
        return
    if all(layer.built for layer in model._flatten_layers()):
        return
    import tensorflow as tf

    strategy = model.distribute_strategy

    @tf.function
    def step(batch: Any) -> Any:
        return strategy.run(model.train_step, args=(batch,))

    try:
        with strategy.scope():
            step.get_concrete_function(spec)
    except Exception as exc:  # noqa: BLE001 - Keras traces it on the first batch's shapes
        logger.info(
            "%s's train_step could not be traced on its data's spec (%s: %s); its layers "
            "are built by its first step.",
            type(model).__name__,
            type(exc).__name__,
            exc,
        )
