"""What Determined 0.38.1's Keras users write that the other corpus tests do not walk: NumPy
``(x, y)`` data for a model with several outputs (``y`` a dict or a list of arrays, which
Determined's data adapter takes), configs written as Determined's examples write them (learning
rates as ``2e-4``, which Determined's YAML 1.2 reader reads as floats; every top-level key of its
0.38.1 schema, ``preemption_timeout`` included), lengths in records and epochs counted in whole
batches as Determined's harness counts them, Keras 2's ``compile(optimizer, loss, [metrics])``
on Keras 3, a ``mixed_float16`` trial's resume, cifar10's shape (``Dropout``, Keras augmentation
layers in ``tf.data``'s ``.map()``), and a ``min_checkpoint_period`` that falls on a validation
that already checkpointed. The last test runs the corpus's ``multi_output_trial``
through ``ckptstore experiment create``, SIGTERM and ``experiment resume``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ckptstore
import ckptstore as det
from ckptstore import errors
from ckptstore.experiment.config import load_config, parse_config
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.registry import Registry
from tests.determined_compat import tf_keras_port_trials as port_trials
from tests.determined_compat.conftest import (
    copy_corpus,
    create_then_sigterm,
    paused_at,
    resume_ok,
)
from tests.determined_compat.test_tf_keras_trial_port import run as run_trial
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras

pytestmark = pytest.mark.e2e  # trains Keras models end to end


class _PreemptAt(keras.callbacks.Callback):
    """Asks for preemption after batch ``at`` (set by ``run_trial``), whatever the workloads."""

    def on_train_batch_end(self, batch, logs=None):
        at, preempt = port_trials.PREEMPTION["at"], port_trials.PREEMPTION["preempt"]
        if at is not None and int(self.model.optimizer.iterations.numpy()) == at:
            preempt.request_preemption()


def _records(n, seed, targets):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, 4)).astype("float32")
    b = rng.normal(size=(n, 2)).astype("float32")
    label = (a.sum(1) > 0).astype("int64")
    value = (a[:, :1] - b[:, :1]).astype("float32")
    if targets == "list":
        return [a, b], [label, value]
    return {"a": a, "b": b}, {"label": label, "value": value}


class TwoOutputTrial(det.keras.TFKerasTrial):
    """Two inputs, two outputs; NumPy data whose inputs and targets are a dict or a list of
    arrays, as the ``targets`` hyperparameter says."""

    def __init__(self, context):
        self.context = context

    def build_model(self):
        a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
        hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
        label = keras.layers.Dense(2, name="label")(hidden)
        value = keras.layers.Dense(1, name="value")(hidden)
        if self.context.get_hparam("targets") == "list":
            model = keras.Model([a, b], [label, value])
            loss = [keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"]
        else:
            model = keras.Model({"a": a, "b": b}, {"label": label, "value": value})
            loss = {"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
            loss["value"] = "mse"
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(keras.optimizers.Adam(0.01))
        model.compile(optimizer=optimizer, loss=loss)
        return model

    def build_training_data_loader(self):
        return _records(40, 0, self.context.get_hparam("targets"))

    def build_validation_data_loader(self):
        return _records(16, 1, self.context.get_hparam("targets"))

    def keras_callbacks(self):
        return [_PreemptAt()]


def _config(max_batches, **extra):
    return {
        "hyperparameters": {"global_batch_size": 8, "targets": "dict"},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": max_batches},
        },
        "entrypoint": "model_def:TwoOutputTrial",
        **extra,
    }


def _run(trial_env, cfg, trial_id, preempt_at=None):
    return run_trial(trial_env, TwoOutputTrial, cfg, trial_id=trial_id, preempt_at=preempt_at)


@pytest.mark.parametrize("targets", ["dict", "list"])
def test_numpy_targets_of_a_two_output_model_train_and_resume_exactly(trial_env, targets):
    """Determined's first data type, ``(x, y)`` of NumPy arrays, takes a list or a dict of
    arrays for ``y`` (a model with several outputs); ckptstore turned ``y`` into one array and
    failed (``TypeError: len() of unsized object`` for a dict, ``ValueError: ... inhomogeneous
    shape`` for a list). Trained straight and preempted at batch 3 then resumed, the two runs
    end with the same weights, optimizer state and validation metrics."""
    _, registry = trial_env
    cfg = _config(8, checkpoint_policy="none", min_validation_period={"batches": 4})
    cfg["hyperparameters"]["targets"] = targets
    straight, result = _run(trial_env, cfg, 1)
    assert result.status == "completed" and result.batches_trained == 8
    assert {"val_loss", "val_label_loss", "val_value_loss"} <= set(result.last_validation)
    _, result = _run(trial_env, cfg, 2, preempt_at=3)
    assert result.status == "preempted" and result.batches_trained == 3
    resumed, result = _run(trial_env, cfg, 2)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 3
    for model in (straight.model, resumed.model):
        assert int(model.optimizer.iterations.numpy()) == 8
    for want, got in zip(straight.model.weights, resumed.model.weights, strict=True):
        np.testing.assert_array_equal(want.numpy(), got.numpy())
    want, got = (
        [(m.steps_completed, m.metrics) for m in registry.get_metrics(trial, "validation")]
        for trial in (1, 2)
    )
    assert [step for step, _ in got] == [4, 8] == [step for step, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, rel=1e-6)


def test_period_checkpoint_at_a_validation_that_checkpointed_is_not_repeated(trial_env):
    """``min_checkpoint_period`` every 2 batches and a validation every 4 under the default
    ``checkpoint_policy: best``: the validation at batch 4 checkpoints (the first is always the
    best) and the period checkpoint at the same batch is not taken again (it was: two
    checkpoints at step 4)."""
    _, registry = trial_env
    cfg = _config(8, min_validation_period={"batches": 4}, min_checkpoint_period={"batches": 2})
    _run(trial_env, cfg, 1)
    steps = sorted(c.steps_completed for c in registry.list_checkpoints(1))
    assert steps == [2, 4, 6, 8]


def test_epochs_and_records_count_whole_batches_as_determined(trial_env):
    """``records_per_epoch: 60`` with ``global_batch_size: 8``: Determined's harness makes an
    epoch ``60 // 8 = 7`` batches and ``max_length: {epochs: 2}`` ``120 // 8 = 15``, so the
    trial validates at 7, 14 and 15 and its checkpoints say which epoch they end. ckptstore
    rounded up (8 batches an epoch: validations at 8 and 15)."""
    _, registry = trial_env
    cfg = _config(1, checkpoint_policy="none", records_per_epoch=60)
    cfg["searcher"]["max_length"] = {"epochs": 2}
    cfg["min_validation_period"] = {"epochs": 1}
    cfg["min_checkpoint_period"] = {"records": 100}  # 100 // 8 = 12 batches
    controller, result = _run(trial_env, cfg, 1)
    assert result.batches_trained == 15 and controller.batches_per_epoch == 7
    assert [m.steps_completed for m in registry.get_metrics(1, "validation")] == [7, 14, 15]
    checkpoints = sorted(registry.list_checkpoints(1), key=lambda c: c.steps_completed)
    assert [(c.steps_completed, c.metadata["epoch"]) for c in checkpoints] == [(12, 1), (15, 2)]


class OneInputTrial(TwoOutputTrial):
    """Input ``a`` and target ``label`` of :func:`_records` only."""

    def build_training_data_loader(self):
        x, y = _records(40, 0, "dict")
        return x["a"], y["label"]

    build_validation_data_loader = build_training_data_loader


class PositionalMetricsTrial(OneInputTrial):
    """Iris's compile: ``model.compile(optimizer, loss, [metrics])``, Keras 2's order."""

    def build_model(self):
        inputs = keras.Input((4,), name="a")
        model = self.context.wrap_model(keras.Model(inputs, keras.layers.Dense(2)(inputs)))
        optimizer = self.context.wrap_optimizer(keras.optimizers.SGD(0.1))
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer, loss, [keras.metrics.sparse_categorical_accuracy])
        return model


def test_keras2_positional_metrics_in_compile(trial_env):
    """On Keras 3 the third positional argument of ``compile`` is ``loss_weights``: Keras
    accepts the metrics list there and fails at the first batch with ``TypeError: Failed to
    convert elements of <function ...> to Tensor``. The trial now stops before training with
    ``InvalidConfig`` naming both fixes; on Keras 2 the same trial trains with its metric."""
    storage, registry = trial_env
    cfg = _config(2, checkpoint_policy="none")
    with ckptstore.core.init(
        storage=storage, registry=registry, trial_id=1, hparams=cfg["hyperparameters"]
    ) as core_context:
        controller = TrialController(PositionalMetricsTrial, core_context, cfg)
        if KERAS_MAJOR == 2:
            result = controller.run()
            assert "val_sparse_categorical_accuracy" in result.last_validation
            return
        with pytest.raises(errors.InvalidConfig, match="loss_weights.*TF_USE_LEGACY_KERAS=1"):
            controller.run()
    assert registry.get_metrics(1, "training") == []  # nothing trained


class MixedPrecisionTrial(OneInputTrial):
    """``mixed_float16`` layers: Keras 3's ``compile`` wraps the optimizer in a
    ``LossScaleOptimizer``; on Keras 2 the trial wraps it itself, as TensorFlow's guide says."""

    def build_model(self):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            inputs = keras.Input((4,), name="a")
            hidden = keras.layers.Dense(8, activation="relu")(inputs)
            model = keras.Model(inputs, keras.layers.Dense(2, dtype="float32")(hidden))
        finally:
            keras.mixed_precision.set_global_policy("float32")
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(keras.optimizers.Adam(0.01))
        if KERAS_MAJOR == 2:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model


def _optimizer_values(model):
    found = model.optimizer.variables
    return [np.asarray(v) for v in (found() if callable(found) else found)]


def test_mixed_precision_trial_resumes_exactly(trial_env):
    """A ``mixed_float16`` trial's ``LossScaleOptimizer`` records the variables it was built
    for as a tuple on Keras 3; the checkpoint said "never built", so the resume left it unbuilt
    and refused the checkpoint (``ResumeError: ... it has 4 variables whereas the saved
    optimizer has 14``). Preempted at batch 3 and resumed, the trial ends with an uninterrupted
    run's weights, loss scale and Adam slots."""
    cfg = _config(6, checkpoint_policy="none")
    straight, _ = run_trial(trial_env, MixedPrecisionTrial, cfg, trial_id=1)
    _, result = run_trial(trial_env, MixedPrecisionTrial, cfg, trial_id=2, preempt_at=3)
    assert result.status == "preempted"
    resumed, result = run_trial(trial_env, MixedPrecisionTrial, cfg, trial_id=2)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 3
    assert type(resumed.model.optimizer).__name__.startswith("LossScaleOptimizer")
    want, got = _optimizer_values(straight.model), _optimizer_values(resumed.model)
    assert len(want) == len(got) > 4  # the loss scale's own variables and Adam's
    for a, b in zip(
        want + straight.model.get_weights(), got + resumed.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(a, b)


class CifarShapeTrial(TwoOutputTrial):
    """cifar10_tf_keras's shape, small: Conv2D and Dropout, a ``tf.data`` pipeline of known
    length wrapped with ``context.wrap_dataset``, batched, then Keras augmentation layers in
    ``.map()`` (the ``augment`` hyperparameter)."""

    def build_model(self):
        model = keras.Sequential(
            [
                keras.Input((6, 6, 3)),
                keras.layers.Conv2D(4, 3, activation="relu"),
                keras.layers.Dropout(0.5),
                keras.layers.Flatten(),
                keras.layers.Dense(3),
            ]
        )
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(keras.optimizers.Adam(0.01))
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=optimizer, loss=loss)
        return model

    def _images(self, n, seed):
        rng = np.random.default_rng(seed)
        images = rng.random((n, 6, 6, 3), dtype=np.float32)
        return images, rng.integers(0, 3, n)

    def build_training_data_loader(self):
        ds = tf.data.Dataset.from_tensor_slices(self._images(40, 0))
        ds = self.context.wrap_dataset(ds).batch(self.context.get_per_slot_batch_size())
        if self.context.get_hparam("augment") == "py_function":  # Python state: not saved
            ds = ds.map(lambda x, y: (tf.py_function(lambda v: v, [x], tf.float32), y))
            ds = ds.map(lambda x, y: (tf.ensure_shape(x, [None, 6, 6, 3]), y))
        elif self.context.get_hparam("augment"):
            flip = keras.Sequential([keras.layers.RandomFlip("horizontal")])
            ds = ds.map(lambda x, y: (flip(x), y))
        return ds

    def build_validation_data_loader(self):
        ds = tf.data.Dataset.from_tensor_slices(self._images(16, 1))
        return self.context.wrap_dataset(ds).batch(8)


def test_dropout_trial_resumes_exactly(trial_env, caplog):
    """Keras 3 keeps a ``Dropout``'s RNG in a ``SeedGenerator`` variable that ``model.keras``
    leaves out; the trial's checkpoints did not hold it, so a resumed trial drew other dropout
    masks from its first batch on and ended with other weights than an uninterrupted one.
    Keras 2's default ``Dropout`` RNG has no state at all: the trial says so, once."""
    cfg = _config(10, checkpoint_policy="none")
    cfg["hyperparameters"]["augment"] = False
    if KERAS_MAJOR == 2:
        with caplog.at_level("WARNING", logger="ckptstore.keras_io.trial.seed_states"):
            run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1)
        (warned,) = [r.getMessage() for r in caplog.records if "default RNG" in r.message]
        assert "dropout" in warned and "enable_tf_random_generator()" in warned
        return
    straight, _ = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1)
    _, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=2, preempt_at=3)
    assert result.status == "preempted"
    resumed, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=2)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 3
    for want, got in zip(straight.model.get_weights(), resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(want, got)


def test_augmentation_in_tf_data_map_checkpoints_with_one_warning(trial_env, caplog):
    """A Keras random augmentation layer in ``.map()`` of a ``tf.data`` pipeline of known
    length holds state TensorFlow will not put in an iterator checkpoint: the trial's first
    checkpoint failed (``FailedPreconditionError: ReadVariableOp is stateful``) and the trial
    with it. It now checkpoints the position and buffers, says once what a resume cannot
    repeat, and resumes at the next batch."""
    cfg = _config(10, checkpoint_policy="none", min_checkpoint_period={"batches": 2})
    cfg["hyperparameters"]["augment"] = True
    with caplog.at_level("WARNING", logger="ckptstore.keras_io.trial.data"):
        _, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1, preempt_at=5)
    assert result.status == "preempted" and result.batches_trained == 5
    warned = [r.getMessage() for r in caplog.records if "draws random numbers outside" in r.message]
    assert len(warned) == 1 and "is stateful" in warned[0], warned  # which op: per Keras
    resumed, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 5
    assert resumed.train_data.position() == {"pass": 2, "batch": 0}  # 10 batches of 5 a pass


YAML_038 = """
name: pix2pix_shape
data:
  BUFFER_SIZE: 400
hyperparameters:
  global_batch_size: 1
  discriminator_lr: 2e-4
  generator_lr:
    type: log
    base: 10
    minval: -5
    maxval: -4
  dropout:
    type: double
    minval: 1e-2
    maxval: 5.0e-1
  steps: 1e3
  name: 2e
records_per_epoch: 400
searcher:
  name: random
  metric: val_total_loss
  max_length:
    batches: 4000
  max_trials: 2
entrypoint: model_def:Pix2PixTrial
"""


def test_floats_written_as_determined_examples_write_them(tmp_path):
    """Determined read configs with ruamel.yaml (YAML 1.2), where ``2e-4`` is a float; PyYAML
    (YAML 1.1) read it as the string ``'2e-4'``, so a trial got ``learning_rate='2e-4'`` and a
    ``double`` range ``minval: 1e-2`` was refused. ``2e`` stays a string."""
    path = tmp_path / "const.yaml"
    path.write_text(YAML_038)
    config = load_config(path)
    hps = {hp.name: hp for hp in config.hyperparameters}
    assert hps["discriminator_lr"].val == 2e-4 and isinstance(hps["discriminator_lr"].val, float)
    assert (hps["dropout"].minval, hps["dropout"].maxval) == (0.01, 0.5)
    assert hps["steps"].val == 1000.0 and hps["name"].val == "2e"


#: Every top-level key of Determined 0.38.1's experiment config schema
#: (``schemas/expconf/v0/experiment.json``); ``entrypoint`` and ``searcher`` are set below.
DETERMINED_038_KEYS = {
    "bind_mounts": [{"host_path": "/data", "container_path": "/data", "read_only": True}],
    "checkpoint_policy": "best",
    "checkpoint_storage": {"save_trial_best": 1},
    "data": {"url": "https://example.invalid/data.npz"},
    "data_layer": {"type": "shared_fs"},
    "debug": False,
    "description": "every key",
    "environment": {"image": "determinedai/tensorflow-ngc:0.38.1"},
    "hyperparameters": {"global_batch_size": 8},
    "integrations": {"pachyderm": {}},
    "internal": None,
    "labels": ["a"],
    "log_policies": [{"pattern": ".*OOM.*", "action": {"type": "cancel_retries"}}],
    "max_restarts": 1,
    "min_checkpoint_period": {"batches": 0},
    "min_validation_period": {"batches": 0},
    "name": "every-key",
    "optimizations": {"aggregation_frequency": 1},
    "pbs": {},
    "perform_initial_validation": False,
    "preemption_timeout": 600,
    "profiling": {"enabled": False},
    "project": "p",
    "records_per_epoch": 0,
    "reproducibility": {"experiment_seed": 1},
    "resources": {"slots_per_trial": 1, "shm_size": 4294967296},
    "retention_policy": {"log_retention_days": 7},
    "scheduling_unit": 100,
    "security": {},
    "slurm": {},
    "tensorboard_storage": {},
    "workspace": "w",
}


def test_every_038_top_level_key_is_accepted():
    """A config with every top-level key of Determined 0.38.1's schema loads (it refused
    ``preemption_timeout`` as unknown); the cluster-only ones are named in the warning."""
    raw = {
        **DETERMINED_038_KEYS,
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 4}},
        "entrypoint": "model_def:Trial",
    }
    config = parse_config(raw)
    assert "preemption_timeout" in config.ignored_keys
    assert {"bind_mounts", "environment.image", "resources.shm_size"} <= set(config.ignored_keys)


def test_multi_output_trial_yaml_pauses_and_resumes(tmp_path):
    """``corpus/multi_output_trial`` (two inputs, two outputs, NumPy dicts, the TensorBoard
    callback next to a plain Keras one) with its pix2pix-shaped const.yaml (``learning_rate:
    2e-3``, lengths in epochs with ``records_per_epoch``, ``min_checkpoint_period`` in batches,
    ``preemption_timeout``, ``bind_mounts``, ``resources.shm_size``, ``environment.image``)
    through ``ckptstore experiment create``, SIGTERM after the first validation, and
    ``ckptstore experiment resume``."""
    storage, registry = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'registry.db'}"
    model_dir = copy_corpus("multi_output_trial", tmp_path)
    err = create_then_sigterm(
        "const.yaml",
        model_dir,
        storage,
        registry,
        lambda reg: reg.get_metrics(1, "validation"),
        MULTI_OUTPUT_BATCH_PAUSE_S="0.15",
    )
    ignored = "preemption_timeout, bind_mounts, resources.shm_size, environment.image"
    assert err.count(ignored) == 1, err[-3000:]
    assert 12 <= paused_at(registry) < 36
    resume_ok(model_dir, storage, registry)
    with Registry(registry) as reg:
        trial = reg.get_trial(1)
        assert trial.state == "COMPLETED"
        assert trial.hparams["learning_rate"] == 0.002 and trial.hparams["size_weight"] == 0.5
        validations = reg.get_metrics(1, "validation")
        # records_per_epoch 96 / global_batch_size 8: an epoch is 12 batches, 3 epochs 36
        assert [row.steps_completed for row in validations] == [12, 24, 36]
        assert {"val_species_accuracy", "val_size_mae"} <= set(validations[-1].metrics)
        steps = [c.steps_completed for c in reg.list_checkpoints(1)]
        assert len(steps) == len(set(steps)) and max(steps) == 36
        assert {6, 18, 30} <= set(steps)  # min_checkpoint_period: 6 batches


def test_a_python_function_in_tf_data_keeps_no_iterator_and_resumes_at_its_batch(trial_env, caplog):
    """A ``tf.py_function`` in ``.map()`` may hold the data's own position (a generator's):
    its iterator is not saved (one warning), and a resumed trial skips to the saved batch of
    the pass instead of restoring an iterator that would resume elsewhere."""
    cfg = _config(10, checkpoint_policy="none", min_checkpoint_period={"batches": 2})
    cfg["hyperparameters"]["augment"] = "py_function"
    with caplog.at_level("WARNING", logger="ckptstore.keras_io.trial.data"):
        _, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1, preempt_at=5)
    assert result.status == "preempted" and result.batches_trained == 5
    warned = [r.getMessage() for r in caplog.records if "a Python function in it" in r.message]
    assert len(warned) == 1 and "EagerPyFunc is stateful" in warned[0], warned
    with caplog.at_level("WARNING", logger="ckptstore.keras_io.trial.data"):
        resumed, result = run_trial(trial_env, CifarShapeTrial, cfg, trial_id=1)
    assert any("holds no tf.data iterator state" in r.getMessage() for r in caplog.records)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 5
    assert resumed.train_data.position() == {"pass": 2, "batch": 0}
