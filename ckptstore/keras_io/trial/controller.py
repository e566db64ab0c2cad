"""The trial controller: trains a TFKerasTrial in workloads of batches, validates, checkpoints,
reports metrics to the registry and resumes exactly from the trial's latest checkpoint.

Scheduling follows Determined: training runs in workloads of at most ``scheduling_unit``
batches that end at every ``min_validation_period`` and ``min_checkpoint_period`` boundary; the
trial always validates and checkpoints when it reaches ``searcher.max_length``, when a callback
stops training, when the searcher prunes it, and (checkpoint only) when it is preempted. Under
``adaptive_asha`` it also validates at every rung boundary
(:meth:`~ckptstore.experiment.config_schema.Searcher.rung_lengths`) and asks the searcher there
whether to go on, as Determined's master told its trials to, so a search prunes even when the
config sets no ``min_validation_period``. After a validation it checkpoints as the config's
``checkpoint_policy`` says: ``best`` (Determined's default) when the searcher metric beats the
experiment's best so far, ``all`` always, ``none`` never. On resume, callbacks get
``on_train_begin`` before ``load_state``, in Determined's order; every callback event comes in
Determined's order and with its logs (:mod:`.callback_events`).

A checkpoint holds ``model.keras`` (architecture, weights, full optimizer state),
``callback_state.json`` (callback states, RNG states, steps — see
:mod:`ckptstore.keras_io.fit._callback_state`) and ``workload_sequencer.json`` (the position in the
training data and the schedule). Resuming rebuilds the model with ``build_model()``, loads those
and continues at the next batch. A trial with no checkpoint of its own warm-starts from
``searcher.source_checkpoint_uuid`` / ``source_trial_id`` (weights only), or from a folder
Determined wrote (weights and optimizer state), read through the migration code that
:mod:`ckptstore.keras` registers (``docs/determined-compat.md``).

On Keras 2 (``tf.keras`` is tf_keras, ``TF_USE_LEGACY_KERAS=1``) the model part is Determined's
Keras 2 layout instead of ``model.keras`` (see :mod:`ckptstore.keras_io.saving._keras2_format`): the TF
checkpoint ``model_checkpoint.*`` with the weights and the optimizer's state — a legacy
optimizer's slots and ``iter`` (``tf.keras.optimizers.legacy.*``) or a Keras 2.11+ optimizer's
variables — plus ``model_config.json``; the layers' RNG states ride in ``callback_state.json``.
Keras 2 trials train with ``train_on_batch`` like Keras 3 ones and keep the same data position,
so a resume continues at the next batch — after a workload, or after the batch at which a
preemption ended one — with the same weights and optimizer state as an uninterrupted run
(``tests/keras_io/test_trial_both_keras.py`` checks both Keras versions). A checkpoint is read
only by the Keras that wrote it: resuming a Keras 3 trial checkpoint under Keras 2 (or the
reverse) raises :class:`~ckptstore.errors.ResumeError`. A module that called
``tf.compat.v1.disable_eager_execution()`` trains on Keras 2 in graph mode; Keras 3 refuses it
(:class:`~ckptstore.errors.NotSupported`).

Example::

    with ckptstore.core.init(storage="/tmp/ckpts", trial_id=1, hparams=hparams) as core_context:
        result = TrialController(MNISTTrial, core_context, config).run()
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing.hints import CommitHints
from ckptstore.checkpointing.jsonfiles import read_json_file
from ckptstore.checkpointing.metrics import reported_value
from ckptstore.experiment.config import ExperimentConfig, Length, parse_config
from ckptstore.experiment.metrics import searcher_metric_value
from ckptstore.keras_io import backend
from ckptstore.keras_io.backend import keras
from ckptstore.keras_io.fit import _callback_state as callback_state
from ckptstore.keras_io.fit import _keras_callback_state as cb_arrays
from ckptstore.keras_io.fit import _mwms_compat as mwms_compat
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _layer_states as layer_states
from ckptstore.keras_io.saving import _optimizers as optimizers_mod
from ckptstore.keras_io.saving import _tf_bundle as tf_bundle
from ckptstore.keras_io.saving import _weights_view as weights_view
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME
from ckptstore.keras_io.trial import callback_events as events
from ckptstore.keras_io.trial import data as data_mod
from ckptstore.keras_io.trial import model_part, resume_source, seed_states
from ckptstore.keras_io.trial.built_model import check_built_model
from ckptstore.keras_io.trial.context import TFKerasTrialContext
from ckptstore.keras_io.trial.trial import TFKerasTrial

logger = logging.getLogger(__name__)

SEQUENCER_FILENAME = model_part.SEQUENCER_FILENAME

#: Called at each rung with (rung length in the unit of max_length, searcher metric); True prunes.
PruneHook = Callable[[int, float], bool]


@dataclasses.dataclass
class TrialResult:
    """How a trial run ended."""

    batches_trained: int
    status: str  # "completed", "stopped_early", "pruned", "preempted"
    last_validation: dict[str, float] = dataclasses.field(default_factory=dict)
    searcher_metric: float | None = None
    latest_checkpoint: str | None = None


_optimizer_variables = optimizers_mod.variables_of


class TrialController:
    """Runs one trial of a :class:`TFKerasTrial` subclass inside a core context.

    Args:
        trial_class: the user's ``TFKerasTrial`` subclass.
        core_context: what ``ckptstore.core.init(...)`` yielded (storage, registry, trial id,
            hparams, preemption).
        config: the experiment config (an :class:`ExperimentConfig` or a raw dict).
        trial_seed: seed for Python, NumPy, TensorFlow (op seed and global generator) and
            Keras random generators.
        prune_hook: called at each ``adaptive_asha`` rung boundary with the rung's length (in the
            unit of ``max_length``) and the searcher metric; True stops the trial.
        warm_start: UUID of the checkpoint a trial without checkpoints of its own starts from
            (``searcher.source_checkpoint_uuid`` / ``source_trial_id``): a ckptstore checkpoint
            (weights only), or a Determined checkpoint folder of that name in the storage, read
            in place (weights and optimizer state, as Determined's warm start restores).
        strategy: the ``tf.distribute.MultiWorkerMirroredStrategy`` of a trial on several
            workers (``core_context.distributed.size > 1``, ``slots_per_trial``): the model is
            built under its scope, each worker trains on its shard of every global batch,
            validation metrics are reduced across workers, and only rank 0 writes checkpoints.
            None: Keras's default strategy (one worker).

    Example::

        result = TrialController(MyTrial, core_context, config, trial_seed=7).run()
        print(result.status, result.last_validation)
    """

    def __init__(
        self,
        trial_class: type[TFKerasTrial],
        core_context: Any,
        config: ExperimentConfig | dict[str, Any],
        *,
        trial_seed: int = 0,
        prune_hook: PruneHook | None = None,
        warm_start: str | None = None,
        strategy: Any = None,
    ) -> None:
        if not (isinstance(trial_class, type) and issubclass(trial_class, TFKerasTrial)):
            raise errors.InvalidConfig(
                f"The entrypoint must name a subclass of ckptstore.keras.TFKerasTrial. "
                f"Received: {trial_class!r}."
            )
        backend.check_backend("TFKerasTrial", ("tensorflow",))
        self.trial_class = trial_class
        self.core = core_context
        self.config = config if isinstance(config, ExperimentConfig) else parse_config(config)
        self.trial_seed = int(trial_seed)
        self.prune_hook = prune_hook
        self.warm_start = warm_start
        self.strategy = strategy
        self.rank = int(core_context.distributed.rank)
        self.size = int(core_context.distributed.size)
        if self.size > 1 and strategy is None:
            raise errors.InvalidConfig(
                f"A trial on {self.size} workers needs their MultiWorkerMirroredStrategy. "
                f"Received: strategy=None at rank {self.rank}. Pass the strategy of "
                "DistributedContext.from_tf_config()."
            )
        self.batches_trained = 0
        self.last_validation_at: int | None = None
        self.last_checkpoint_at: int | None = None
        self.last_validation: dict[str, float] = {}
        self.latest_checkpoint: str | None = None
        #: Callback states and RNG states read by ``_restore``, applied after ``on_train_begin``.
        self._resumed_state: callback_state.TrainingState | None = None

    # ---- set-up ---------------------------------------------------------------------------------
    def _build(self) -> None:
        info = self.core.info
        backend.check_eager("TFKerasTrial")
        callback_state.seed_rng(self.trial_seed)
        self.context = TFKerasTrialContext(
            dict(info.trial.hparams),
            experiment_config=self.config.raw,
            distributed=self.core.distributed,
            trial_id=info.trial.trial_id,
            experiment_id=info.trial.experiment_id,
            trial_seed=self.trial_seed,
            core_context=self.core,
        )
        self.trial = self.trial_class(self.context)
        if type(self.trial).session_config is not TFKerasTrial.session_config:
            if self.trial.session_config() is not None:
                logger.warning(
                    "session_config() is ignored under TensorFlow 2; configure TensorFlow with "
                    "tf.config (threads, devices) at the top of model_def.py instead."
                )
        if self.size > 1:
            # Keras 3's multi-worker fit/evaluate needs these fixes (see _mwms_compat)
            mwms_compat.apply_mwms_compat()
            logger.info(
                "Trial %s: rank %d of %d workers", info.trial.trial_id, self.rank, self.size
            )
        with self._scope():  # variables (model, optimizer, metrics) mirrored across workers
            self.model = self.trial.build_model()
        check_built_model(self.model)
        seed_states.warn_unsaved(self.model)
        # model.optimizer and every wrapped one (a GAN's two), saved and restored by name
        self.optimizers = optimizers_mod.named_optimizers(self.model, self.context.optimizers)
        self.model_writer = model_part.ModelPartWriter()
        fit = self.context.fit_config
        self.gbs = self.context.get_global_batch_size()
        self.context.get_per_slot_batch_size()  # warns when gbs does not split evenly
        self.train_data = data_mod.training_data(
            self.trial.build_training_data_loader(),
            batch_size=self.gbs,
            rank=self.rank,
            size=self.size,
            shuffle=fit["shuffle"],
            seed=self.trial_seed,
            workers=fit["workers"],
            use_multiprocessing=fit["use_multiprocessing"],
            max_queue_size=fit["max_queue_size"],
        )
        self.val_data = self.trial.build_validation_data_loader()
        data_mod.evaluate_kwargs(self.val_data, self.gbs)  # type check now, not later
        train = self.core.train
        if getattr(train, "searcher_metric", "") is None:
            # core.init does not read the experiment config; checkpoint_policy=best ranks by it
            train.searcher_metric = self.config.searcher.metric
            train.smaller_is_better = self.config.searcher.smaller_is_better
        self.user_callbacks = list(self.trial.keras_callbacks() or [])
        for cb in self.user_callbacks:  # det.keras.callbacks.TensorBoard syncs to our storage
            bind = getattr(cb, "bind_core_context", None)
            if callable(bind):
                bind(self.core)
        self.callbacks, self._eval_callbacks = (
            kind(self.user_callbacks, add_history=False, add_progbar=False, model=self.model)
            for kind in (keras.callbacks.CallbackList, events.TestEndLater)
        )
        self._schedule()

    def _schedule(self) -> None:
        cfg = self.config
        rpe = cfg.records_per_epoch or self.train_data.records_per_pass
        self.max_batches = cfg.searcher.max_length.to_batches(self.gbs, rpe)
        self.val_period = (
            cfg.min_validation_period.to_batches(self.gbs, rpe)
            if cfg.min_validation_period
            else None
        )
        self.ckpt_period = (
            cfg.min_checkpoint_period.to_batches(self.gbs, rpe)
            if cfg.min_checkpoint_period
            else None
        )
        # rung boundary in batches -> the rung's length in the searcher's unit
        self.rungs: dict[int, int] = {}
        if cfg.searcher.name == "adaptive_asha" and cfg.searcher.max_length is not None:
            unit = cfg.searcher.max_length.unit
            for length in cfg.searcher.rung_lengths()[:-1]:
                self.rungs[Length(unit, length).to_batches(self.gbs, rpe)] = length
        if cfg.records_per_epoch:
            # whole batches, as Determined's harness counts an epoch for the callbacks
            self.batches_per_epoch: int | None = max(1, cfg.records_per_epoch // self.gbs)
        else:
            self.batches_per_epoch = self.train_data.batches_per_pass
        logger.info(
            "Trial %s: %d batches of %d records; %s",
            self.context.trial_id,
            self.max_batches,
            self.gbs,
            self._schedule_summary(),
        )

    def _schedule_summary(self) -> str:
        """When the trial validates and checkpoints, in words (its first log line): it said
        ``checkpoint every None batches`` without ``min_checkpoint_period``."""
        validation = f"every {self.val_period} batches" if self.val_period else "at the end"
        when = [f"every {self.ckpt_period} batches"] if self.ckpt_period else []
        if self.val_period and self.config.checkpoint_policy in ("best", "all"):
            best = self.config.checkpoint_policy == "best"
            when.append("after each validation" + (" that is the best so far" if best else ""))
        return f"validation {validation}; checkpoint {', '.join([*when, 'at the end'])}"

    # ---- checkpoints ------------------------------------------------------------------------------
    def _scope(self) -> contextlib.AbstractContextManager[Any]:
        """The strategy's scope with several workers (variables made there are mirrored)."""
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def _agree(self, value: Any) -> Any:
        """The chief's ``value`` on every worker: decisions that read the registry or the
        searcher (checkpoint now? prune?) must not differ between workers."""
        return self.core.distributed.broadcast(value) if self.size > 1 else value

    def _ensure_built(self, folder: str | None = None) -> None:
        """Create every variable a checkpoint restores into: the model's, and each optimizer's
        for the variables it was built for (``optimizers.json``; older checkpoints: the model's
        optimizer for every trainable variable)."""
        record = optimizers_mod.read(folder) if folder is not None else None
        with self._scope():
            self._build_model_variables()
            if record is not None and folder is not None:
                optimizers_mod.build(self.model, self.optimizers, record, folder)
            else:
                self._build_optimizer()

    def _build_model_variables(self) -> None:
        if not model_part.mark_built(self.model) or not self.model.trainable_variables:
            position = self.train_data.position()
            x, _, _ = self.train_data.next_batch()
            try:
                self.model(x)
            except Exception:
                # a GAN's call() may not take a batch; its sub-models hold its variables
                if not self.model.trainable_variables:
                    raise
            self.train_data.restore(position)

    def _build_optimizer(self) -> None:
        if backend.IS_KERAS2 and not hasattr(self.model.optimizer, "build"):
            keras2_format._create_legacy_slots(self.model)  # legacy optimizer: slots + iter
        elif backend.IS_KERAS2:
            with self.model.distribute_strategy.scope():
                self.model.optimizer.build(self.model.trainable_variables)
        else:
            self.model.optimizer.build(self.model.trainable_variables)

    def _warm_start_from_determined(self, path: str, uuid: str, layout: str) -> None:
        """Determined's warm start restores weights and optimizer state and starts the schedule
        afresh; its pickles (RNG, callback and sequencer state) run code when read, so they are
        not read, and steps count from 0 as in Determined (another trial's sequencer)."""
        logger.info(
            "Warm-starting trial %s from Determined %s checkpoint %s (weights and optimizer "
            "state; its pickled RNG/callback state is not read)",
            self.context.trial_id,
            layout,
            uuid,
        )
        self._ensure_built()
        keras2_format.load_determined(self.model, path, with_optimizer=True)

    def _restore(self, uuid: str) -> None:
        trial_id = self.context.trial_id
        with resume_source.checkpoint_folder(self.core.checkpoint, uuid) as (path, view):
            layout = None
            if not os.path.exists(os.path.join(path, callback_state.STATE_FILENAME)):
                layout = keras2_format.determined_layout(path)
            if layout is not None:
                self._warm_start_from_determined(path, uuid, layout)
                return
            state = callback_state.read_state(path)
            seq_path = os.path.join(path, SEQUENCER_FILENAME)
            sequencer = {}
            if os.path.exists(seq_path):
                sequencer = read_json_file(seq_path)  # bounded: typed errors
            # a deduplicated model.keras on a local store: read in place from its chunks
            model_file: str | Any = view or os.path.join(path, MODEL_FILENAME)
            if view is None and not os.path.exists(model_file):  # not saved whole by Keras
                model_file = os.path.join(path, model_part.WEIGHTS_FILENAME)
            if view is None:
                model_part.check_layout(os.fspath(path), uuid)
            same_trial = state is not None and state.continue_id == trial_id
            self._ensure_built(os.fspath(path) if same_trial else None)
            if same_trial:
                if backend.IS_KERAS2:
                    keras2_format.load_weights(self.model, os.fspath(path), with_optimizer=True)
                else:
                    resume_source.load_weights(self.model, model_file, uuid)
                record = optimizers_mod.read(os.fspath(path))
                if record is not None:
                    optimizers_mod.assign(self.optimizers, record, os.fspath(path))
                assert state is not None
                if state.layer_states:
                    arrays = cb_arrays.arrays_from_file(
                        os.path.join(path, cb_arrays.ARRAYS_FILENAME)
                    )
                    state.layer_states = cb_arrays.join_arrays(state.layer_states, arrays)
                if "data_position" in sequencer:
                    self.train_data.restore(sequencer["data_position"])
                    read_files = getattr(self.train_data, "read_files", None)
                    if callable(read_files):
                        read_files(os.fspath(path))
            else:  # warm start: weights only, fresh optimizer and schedule
                logger.info(
                    "Warm-starting trial %s from checkpoint %s (weights only)", trial_id, uuid
                )
                if backend.IS_KERAS2:
                    keras2_format.load_weights(self.model, os.fspath(path), with_optimizer=False)
                else:
                    weights_view.load_weights(self.model, model_file, with_optimizer=False)
                for var in _optimizer_variables(self.model.optimizer):
                    dtype = getattr(var.dtype, "as_numpy_dtype", var.dtype)  # tf.DType on Keras 2
                    var.assign(np.zeros(var.shape, dtype=dtype))
                return
        assert state is not None
        self.batches_trained = int(state.steps_completed)
        self.context.initial_batch = self.batches_trained
        self.last_validation_at = sequencer.get("last_validation_at")
        self.last_checkpoint_at = self.batches_trained
        self.last_validation = dict(sequencer.get("last_validation") or {})
        seed_states.restore(self.model, state.extra_variables, uuid)
        layer_states.restore(self.model, state.layer_states, uuid)
        self._resumed_state = state
        self.latest_checkpoint = uuid
        logger.info(
            "Resumed trial %s from checkpoint %s at batch %d", trial_id, uuid, self.batches_trained
        )

    def _load_callback_states(self) -> None:
        """Callbacks' ``load_state`` and the RNG states of a resumed trial. Determined calls
        ``on_train_begin`` first and ``load_state`` after it, so a callback's ``on_train_begin``
        (Keras's EarlyStopping resets ``wait`` and ``best`` there) cannot undo the restored
        state, and RNG draws in ``on_train_begin`` do not shift the restored streams."""
        state, self._resumed_state = self._resumed_state, None
        if state is None:
            return
        for key, cb in callback_state.stateful_callbacks(self.user_callbacks).items():
            if key in state.callbacks:
                cb.load_state(state.callbacks[key])
        callback_state.restore_rng(state.rng)
        keras2_format.restore_layer_rng(self.model, state.rng)

    def _checkpoint(self) -> str:
        """Rank 0 writes and commits the checkpoint; the other workers write nothing and learn
        its UUID (the model's variables are mirrored, so rank 0 holds every value)."""
        uuid = self._agree(self._write_checkpoint() if self.rank == 0 else None)
        self.last_checkpoint_at = self.batches_trained
        self.latest_checkpoint = uuid
        logger.info(
            "Trial %s: checkpoint %s at batch %d", self.context.trial_id, uuid, self.batches_trained
        )
        return uuid

    def _write_checkpoint(self) -> str:
        trial_id = self.context.trial_id
        epochs = self.batches_trained // self.batches_per_epoch if self.batches_per_epoch else 0
        metadata = {
            "steps_completed": self.batches_trained,
            "continue_id": trial_id,
            "epoch": epochs,
            "framework": "ckptstore.keras.TFKerasTrial",
            # what builds the model of a checkpoint that holds its weights only
            model_part.TRIAL_CLASS_KEY: f"{self.trial_class.__module__}:"
            f"{self.trial_class.__qualname__}",
            "keras_version": keras.__version__,
            # how many workers trained it (Ray Train / TF_CONFIG workers; 1 when launched alone)
            "distributed": {"size": self.context.distributed.get_size()},
            "metrics": {"validation_metrics": dict(self.last_validation)},
            "hparams": self.context.get_hparams(),
        }
        states = {
            key: cb.get_state()
            for key, cb in callback_state.stateful_callbacks(self.user_callbacks).items()
        }
        state = callback_state.TrainingState(
            epoch=epochs,
            steps_completed=self.batches_trained,
            continue_id=trial_id,
            epoch_complete=bool(self.batches_per_epoch)
            and self.batches_trained % self.batches_per_epoch == 0,
            callbacks=states,
            rng={**callback_state.capture_rng(), **keras2_format.capture_layer_rng(self.model)},
            extra_variables=seed_states.capture(self.model),
        )
        state.layer_states, arrays = cb_arrays.split_arrays(
            layer_states.capture(self.model) or None
        )
        sequencer = {
            "batches_trained": self.batches_trained,
            "data_position": self.train_data.position(),
            "last_validation_at": self.last_validation_at,
            "last_validation": self.last_validation,
        }
        # callback_state.json cut around its parts: unchanged RNG states dedup (issue 19).
        state_json, state_cuts = state.to_json_with_cuts()
        hints = CommitHints(cuts={callback_state.STATE_FILENAME: state_cuts})
        with self.core.checkpoint.store_path(metadata, hints=hints) as (path, uuid):
            missing = self.model_writer.write(self.model, self.optimizers, os.fspath(path))
            if missing:  # read when the block exits: the checkpoint says what it lacks
                metadata["missing"] = missing
            with open(
                os.path.join(path, callback_state.STATE_FILENAME), "w", encoding="utf-8"
            ) as f:
                f.write(state_json)
            with open(os.path.join(path, SEQUENCER_FILENAME), "w", encoding="utf-8") as f:
                json.dump(sequencer, f)
            if arrays:
                with open(os.path.join(path, cb_arrays.ARRAYS_FILENAME), "wb") as f:
                    f.write(cb_arrays.arrays_to_bytes(arrays))
            write_files = getattr(self.train_data, "write_files", None)
            if callable(write_files):
                write_files(os.fspath(path))
            for cb in self.user_callbacks:
                hook = getattr(cb, "on_checkpoint_end", None)
                if callable(hook):
                    hook(os.fspath(path))  # a str, as Determined passed checkpoint_dir
            if self.core.checkpoint.dedup:
                # model_checkpoint.data-* (and any SavedModel a hook wrote) cut at its tensors
                tf_bundle.add_folder_cuts(os.fspath(path), hints.cuts)
        return uuid

    # ---- training ---------------------------------------------------------------------------------
    def _next_boundary(self) -> int:
        end = self.max_batches
        for period in (self.val_period, self.ckpt_period):
            if period:
                end = min(end, (self.batches_trained // period + 1) * period)
        ahead = [b for b in self.rungs if b > self.batches_trained]
        if ahead:
            end = min(end, min(ahead))
        return min(end, self.batches_trained + self.config.scheduling_unit)

    def _counts(self) -> dict[str, int]:
        return events.counts(self.batches_trained, self.batches_per_epoch)

    def _train_workload(self, n: int) -> dict[str, float]:
        fit = self.context.fit_config
        logs: list[dict[str, Any]] = []
        bpe = self.batches_per_epoch
        end = self.batches_trained + n
        for i in range(n):
            if bpe and self.batches_trained % bpe == 0:
                self.callbacks.on_epoch_begin(self.batches_trained // bpe)
            if i == 0:  # Determined's multiplexer: at the first batch, after on_epoch_begin
                events.workload_hook(
                    self.user_callbacks, "on_train_workload_begin", self.batches_trained, n, {}
                )
            step = self.batches_trained % bpe if bpe else self.batches_trained
            self.callbacks.on_train_batch_begin(step)
            x, y, sw = self.train_data.next_batch()
            batch_logs = self._train_on_batch(x, y, sw, fit["class_weight"])
            self.batches_trained += 1
            logs.append(batch_logs)
            self.callbacks.on_train_batch_end(step, batch_logs)
            if self.context.get_stop_requested():  # Determined's context.set_stop_requested(True)
                self.model.stop_training = True
            if bpe and self.batches_trained % bpe == 0:
                self.callbacks.on_epoch_end(self.batches_trained // bpe - 1, {})
            if self.model.stop_training:
                break
            if self.batches_trained < end and self.core.preempt.should_preempt():
                # react within one batch: the workload ends here and run() checkpoints
                break
        metrics = events.mean_logs(logs)
        events.workload_hook(
            self.user_callbacks,
            "on_train_workload_end",
            self.batches_trained,
            {**metrics, **self._counts()},
        )
        self.core.train.report_training_metrics(self.batches_trained, metrics)
        return metrics

    def _train_on_batch(self, x: Any, y: Any, sw: Any, class_weight: Any) -> dict[str, Any]:
        if y is None and sw is None and self.strategy is None and not backend.graph_mode():
            return self._train_on_inputs(x)
        if backend.IS_KERAS2 and self.strategy is not None and not backend.graph_mode():
            return mwms_compat.keras2_worker_batch_step(
                self.model, self.strategy, x, y, sw, class_weight
            )
        if not backend.graph_mode():
            return self.model.train_on_batch(
                x, y, sample_weight=sw, class_weight=class_weight, return_dict=True
            )
        return self._named(
            self.model.train_on_batch(x, y, sample_weight=sw, class_weight=class_weight)
        )

    def _train_on_inputs(self, x: Any) -> dict[str, Any]:
        """One step on an inputs-only batch: ``train_step`` gets the batch as the data gave
        it, as under ``fit()`` (``train_on_batch`` would hand it ``(x, None, None)`` on Keras 3,
        ``(x,)`` on Keras 2, which a GAN's ``train_step(images)`` cannot take)."""
        model = self.model
        model.make_train_function()
        model.reset_metrics()
        if backend.IS_KERAS2:
            import tensorflow as tf

            strategy = model.distribute_strategy
            with strategy.scope():
                batches = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
                logs = model.train_function(iter(batches))
        else:
            logs = model.train_function(iter([x]))
        return dict(logs)

    def _named(self, logs: Any) -> dict[str, Any]:
        """Keras 2's graph-mode Model (a module that called
        ``tf.compat.v1.disable_eager_execution()``) has no ``return_dict``: it returns a value or
        a list in ``metrics_names`` order."""
        if isinstance(logs, dict):
            return logs
        return dict(zip(self.model.metrics_names, np.atleast_1d(logs).tolist(), strict=True))

    @functools.cached_property
    def _validation_steps(self) -> int | None:
        """Keras 2 evaluates a per-worker (distributed) dataset only for a given number of
        steps: every worker runs the most batches any worker's shard has (the collectives need
        all workers in each step; a worker whose shard ended contributes an empty batch, as
        tf.distribute does for uneven inputs). None when the data is not a tf.data dataset.
        Worked out at the first validation (every worker validates then) and kept: the
        validation data does not change during a trial."""
        if not data_mod.is_tf_dataset(self.val_data):
            return None
        count = int(self.val_data.cardinality())
        if count == -1:  # infinite: only the config's validation_steps can say
            return None
        if count < 0:  # unknown (e.g. after filter): count this worker's batches once
            count = int(self.val_data.reduce(0, lambda n, _: n + 1))
        return max(self.core.distributed.allgather(count))

    def _validate(self) -> dict[str, float]:
        fit = self.context.fit_config
        kwargs = data_mod.evaluate_kwargs(self.val_data, self.gbs, strategy=self.strategy)
        options = {"return_dict": True} if not backend.graph_mode() else {}
        steps = fit["validation_steps"]
        if steps is None and backend.IS_KERAS2 and self.strategy is not None:
            steps = self._validation_steps
        logs = self.model.evaluate(
            **kwargs,
            steps=steps,
            callbacks=self._eval_callbacks,
            verbose=1 if fit["verbose"] else 0,
            **options,
        )
        logs = self._named(logs)
        metrics = {f"val_{k}": float(events.to_float(v)) for k, v in logs.items()}
        events.workload_hook(self.user_callbacks, "on_test_end", dict(metrics))
        self.last_validation = metrics
        self.last_validation_at = self.batches_trained
        self.core.train.report_validation_metrics(self.batches_trained, metrics)
        logger.info(
            "Trial %s: validation at batch %d: %s",
            self.context.trial_id,
            self.batches_trained,
            metrics,
        )
        return metrics

    def _searcher_value(self, metrics: dict[str, float]) -> float:
        metric = self.config.searcher.metric
        # A diverged run's NaN is reported as NaN (the searcher must see it), not as missing.
        value = reported_value(metrics, metric)
        if value is None:
            raise errors.InvalidConfig(
                f"searcher.metric {metric!r} is not among the validation metrics "
                f"{sorted(metrics)}. Set `searcher.metric` to one of them."
            )
        return value

    def _experiment_best(self) -> float | None:
        """The experiment's best searcher metric so far (None: no validation yet, or a core
        context without Determined's ``get_experiment_best_validation``)."""
        get = getattr(self.core.train, "get_experiment_best_validation", None)
        return get() if callable(get) else None

    def _validate_then_checkpoint(self) -> float:
        """Validate, then checkpoint as ``checkpoint_policy`` says (Determined's workload
        sequencer): ``best`` when the searcher metric beats the experiment's best *before* this
        validation was reported, ``all`` always, ``none`` never (periodic, end-of-training and
        preemption checkpoints are taken under every policy)."""
        policy = self.config.checkpoint_policy
        before = self._experiment_best() if policy == "best" and self.rank == 0 else None
        value = self._searcher_value(self._validate())
        if self.batches_trained == 0 or self.last_checkpoint_at == self.batches_trained:
            return value  # Determined: a checkpoint at step 0 or the current one is not redone
        if self._agree(policy == "all" or (policy == "best" and self._beats(value, before))):
            self._checkpoint()
        return value

    def _beats(self, value: float, before: float | None) -> bool:
        if not math.isfinite(value):  # a diverged validation is never the best one
            return False
        if before is None:
            return True
        return value < before if self.config.searcher.smaller_is_better else value > before

    def run(self) -> TrialResult:
        """Train to ``searcher.max_length`` (or until stopped, pruned or preempted)."""
        self._build()
        latest = self.core.info.latest_checkpoint
        if latest:
            self._restore(latest)
            protect = getattr(self.core.checkpoint, "protect", None)
            if callable(protect) and self.rank == 0:
                protect(latest)
        elif self.warm_start:
            self._restore(self.warm_start)
        status = "completed"
        self.model.stop_training = False
        self.callbacks.on_train_begin()
        self._load_callback_states()
        try:
            if (
                self.config.perform_initial_validation
                and self.batches_trained == 0
                and self.last_validation_at is None
            ):
                self._validate_then_checkpoint()
            while self.batches_trained < self.max_batches:
                n = self._next_boundary() - self.batches_trained
                self._train_workload(n)
                at_end = self.batches_trained >= self.max_batches or self.model.stop_training
                rung = self.rungs.get(self.batches_trained)
                periodic = self.val_period and self.batches_trained % self.val_period == 0
                if at_end or periodic or rung is not None:
                    value = self._validate_then_checkpoint()
                    if self.prune_hook is not None and rung is not None and not at_end:
                        # the chief alone tells the searcher (once per trial, not per worker)
                        if self._agree(self.rank == 0 and self.prune_hook(rung, value)):
                            status = "pruned"
                            break
                if self.model.stop_training:
                    status = "stopped_early"
                    break
                if self.ckpt_period and self.batches_trained % self.ckpt_period == 0:
                    # not again when the validation at this batch checkpointed already
                    due = self.last_checkpoint_at != self.batches_trained
                    if due and self.batches_trained < self.max_batches:
                        self._checkpoint()
                if self.core.preempt.should_preempt():
                    status = "preempted"
                    break
            if self.last_validation_at != self.batches_trained and status != "preempted":
                self._validate()
            if self.last_checkpoint_at != self.batches_trained:
                self._checkpoint()
            if status == "preempted":
                self.core.preempt.acknowledge_preemption_signal()
        finally:
            self.train_data.close()
        self.callbacks.on_train_end()
        metric = searcher_metric_value(self.last_validation, self.config.searcher.metric)
        return TrialResult(
            batches_trained=self.batches_trained,
            status=status,
            last_validation=dict(self.last_validation),
            searcher_metric=metric,
            latest_checkpoint=self.latest_checkpoint,
        )


__all__ = ["TrialController", "TrialResult", "searcher_metric_value"]
