"""Determined 0.38.1's TFKerasTrial tests (``harness/tests/experiment/keras/
test_tf_keras_trial.py``), behaviour by behaviour, on ckptstore's trial controller.

Determined's module drives its controller with hand-made workload streams and cannot run here
(its code stays in its repository, and it needs Determined's harness); each test below checks
the same user-facing behaviour through ``TrialController(trial_class, core_context, config)``
on local storage and a SQLite registry, with trial classes of the same shape
(``tests/determined_compat/tf_keras_port_trials.py``). Each docstring names the Determined test.
The table of what is ported and what is not is in ``docs/determined-compat.md`` ("Determined's
test_tf_keras_trial.py, test by test"). The module runs on Keras 3 and, through
``tests/keras_io/test_keras2_suite.py``, on Keras 2 with legacy optimizers.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import tensorflow as tf

import ckptstore
import ckptstore as det
from ckptstore import errors
from ckptstore.keras_io.trial.controller import TrialController
from tests.determined_compat import tf_keras_port_trials as trials
from tests.keras_io.keras_under_test import keras, optimizer_variables

pytestmark = pytest.mark.e2e  # trains Keras models end to end

XOR_HPARAMS = {"hidden_size": 4, "learning_rate": 1.0, "global_batch_size": 4}
SEED = 325


def xor_config(max_batches, val, unit, **extra):
    raw = {
        "hyperparameters": dict(XOR_HPARAMS),
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": max_batches},
        },
        "min_validation_period": {"batches": val},
        "scheduling_unit": unit,
        "checkpoint_policy": "none",
    }
    raw.update(extra)
    return raw


def run(trial_env, trial_class, cfg, *, trial_id=1, preempt_at=None, seed=SEED):
    storage, registry = trial_env
    cfg = {"entrypoint": f"model_def:{trial_class.__name__}", **cfg}
    with ckptstore.core.init(
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        hparams=cfg["hyperparameters"],
        preempt_signals=False,
    ) as core_context:
        trials.PREEMPTION.update(preempt=core_context.preempt, at=preempt_at)
        controller = TrialController(trial_class, core_context, cfg, trial_seed=seed)
        result = controller.run()
    return controller, result


def metrics(registry, trial_id, kind):
    return [(m.steps_completed, m.metrics) for m in registry.get_metrics(trial_id, kind)]


def assert_same_metrics(got, want):
    """Same steps and metric names; values equal up to float summation order."""
    assert [(step, sorted(m)) for step, m in got] == [(step, sorted(m)) for step, m in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a == pytest.approx(b, rel=1e-6)


def model_state(model):
    return [np.asarray(v.numpy()) for v in [*model.weights, *optimizer_variables(model)]]


def test_executing_eagerly():
    """Ports ``test_executing_eagerly``: importing ckptstore's Keras API leaves eager on."""
    import ckptstore.keras  # noqa: F401

    assert tf.executing_eagerly()


def test_require_global_batch_size(trial_env):
    """Ports ``TestKerasTrial.test_require_global_batch_size``: no ``global_batch_size``
    hyperparameter is Determined's ``InvalidExperimentException`` (our typed error)."""
    cfg = xor_config(4, 4, 4)
    del cfg["hyperparameters"]["global_batch_size"]
    with pytest.raises(
        det.errors.InvalidExperimentException,
        match="global_batch_size is a required hyperparameter",  # Determined's test's match
    ):
        run(trial_env, trials.XORTrial, cfg)
    assert issubclass(det.errors.InvalidExperimentException, errors.InvalidConfig)


def test_xor_trains_to_zero_error(trial_env):
    """Ports ``TestKerasTrial.test_xor_training``: XOR learns; the training loss of each
    workload is below the one before, and the last validation has no error."""
    _, registry = trial_env
    _, result = run(trial_env, trials.XORTrial, xor_config(120, 40, 20))
    assert result.status == "completed" and result.batches_trained == 120
    losses = [m["loss"] for _, m in metrics(registry, 1, "training")]
    assert len(losses) == 6
    assert all(newer < older for older, newer in zip(losses, losses[1:], strict=False)), losses
    validation = metrics(registry, 1, "validation")
    assert [step for step, _ in validation] == [40, 80, 120]
    errors_seen = [m["val_xor_error"] for _, m in validation]
    assert errors_seen == sorted(errors_seen, reverse=True) and errors_seen[-1] == 0.0


XOR_VARIANTS = [
    trials.XORTrial,
    trials.XORTrialOldOptimizerAPI,
    trials.XORTrialWithTrainingMetrics,
    trials.XORTrialWithCustomObjects,
    trials.XORTrialWithOptimizerState,
]
CUSTOM_OBJECTS = {
    "CustomDenseLayer": trials.CustomDenseLayer,
    "CustomOptimizer": trials.CustomOptimizer,
    "custom_activation": trials.XORTrialWithCustomObjects.custom_activation,
    "custom_loss": trials.XORTrialWithCustomObjects.custom_loss,
    "xor_error": trials.xor_error,
    "predictions": trials.predictions,
}


@pytest.mark.parametrize("trial_class", XOR_VARIANTS, ids=lambda c: c.__name__)
def test_xor_checkpoint_restore_and_reproducibility(trial_env, trial_class):
    """Ports ``TestKerasTrial.test_checkpointing``, ``test_optimizer_state`` and
    ``test_reproducibility`` (each over the fixture's XOR variants, plus Determined's unused
    ``XORTrialWithOptimizerState``): two runs with one seed report the same metrics; a run
    stopped at a checkpoint and resumed ends with the weights, optimizer state and metrics of an
    uninterrupted one; the checkpoint loads with ``load_model_from_checkpoint_path`` and
    evaluates to the validation loss the trial reported."""
    storage, registry = trial_env
    cfg = xor_config(16, 8, 4)
    straight, result = run(trial_env, trial_class, cfg, trial_id=1)
    assert result.status == "completed" and result.batches_trained == 16
    _, result = run(trial_env, trial_class, cfg, trial_id=2, preempt_at=8)
    assert result.status == "preempted" and result.batches_trained == 8
    # same seed, same metrics (reproducibility) up to the preemption
    assert metrics(registry, 2, "training") == metrics(registry, 1, "training")[:2]
    assert metrics(registry, 2, "validation") == metrics(registry, 1, "validation")[:1]
    resumed, result = run(trial_env, trial_class, cfg, trial_id=2)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 8
    for want, got in zip(model_state(straight.model), model_state(resumed.model), strict=True):
        np.testing.assert_array_equal(want, got)
    assert len(optimizer_variables(resumed.model)) >= 1  # iterations, and Adam's slots
    assert int(keras.backend.get_value(resumed.model.optimizer.iterations)) == 16
    assert_same_metrics(metrics(registry, 2, "training"), metrics(registry, 1, "training"))
    want_val = metrics(registry, 1, "validation")
    assert_same_metrics(metrics(registry, 2, "validation"), want_val)

    checkpoint = registry.latest_checkpoint(2)
    model = det.keras.load_model_from_checkpoint_path(
        os.path.join(storage, checkpoint.uuid), custom_objects=CUSTOM_OBJECTS
    )
    assert isinstance(model, keras.Model)
    x, y = trials.xor_data()
    loss = keras.losses.BinaryCrossentropy(from_logits=True)(y[:, None], model(x))
    assert float(loss) == pytest.approx(want_val[-1][1]["val_loss"], rel=1e-5)


class XORTrialWithLayerInItsModule(trials.XORTrial):
    """The custom layer lives in a module the process running the trial already imported."""

    def hidden_layer(self):
        return trials.CustomDenseLayer(self.context.get_hparam("hidden_size"), activation="tanh")


def test_custom_layer_of_an_imported_module_loads_without_custom_objects(trial_env):
    """Issue 38, finding 7 (a held-out trial's shape): the checkpoint of a trial whose custom
    layer is defined in an already-imported module loads without ``custom_objects``: using the
    class imports nothing (a module not imported yet is still refused:
    ``tests/keras_io/test_code_refs_imported.py``)."""
    storage, registry = trial_env
    run(trial_env, XORTrialWithLayerInItsModule, xor_config(4, 4, 4))
    checkpoint = registry.latest_checkpoint(1)
    # compile=False: its compiled metric functions are recorded by Keras under "builtins"
    model = det.keras.load_model_from_checkpoint_path(
        os.path.join(storage, checkpoint.uuid), compile=False
    )
    assert any(type(layer) is trials.CustomDenseLayer for layer in model.layers)
    x, _ = trials.xor_data()
    assert model(x).shape[0] == len(x)


def test_xor_training_with_metrics(trial_env):
    """Ports ``TestKerasTrial.test_xor_training_with_metrics``: every compiled metric,
    function metrics included, is reported with the training metrics."""
    _, registry = trial_env
    run(trial_env, trials.XORTrialWithTrainingMetrics, xor_config(8, 8, 4))
    training = metrics(registry, 1, "training")
    assert [step for step, _ in training] == [4, 8]
    for _, logs in training:
        assert {"loss", "xor_error", "binary_accuracy", "predictions"} <= set(logs)


def test_early_stopping(trial_env):
    """Ports ``TestKerasTrial.test_early_stopping``: a callback that sets
    ``model.stop_training`` in ``on_train_workload_end`` ends the trial after that workload, with
    a validation and a checkpoint there."""
    _, registry = trial_env
    cfg = xor_config(500, 10, 5)
    cfg["hyperparameters"]["stop_early"] = True
    _, result = run(trial_env, trials.XORTrial, cfg)
    assert result.status == "stopped_early" and result.batches_trained == 5
    assert [step for step, _ in metrics(registry, 1, "validation")] == [5]
    assert registry.latest_checkpoint(1).steps_completed == 5


def one_var_config(max_batches, unit, **hparams):
    return {
        "hyperparameters": {
            "learning_rate": 0.001,
            "global_batch_size": 3,
            "dataset_range": 10,
            **hparams,
        },
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": max_batches},
        },
        "scheduling_unit": unit,
        "records_per_epoch": 12,
        "checkpoint_policy": "none",
    }


def one_batch_workloads(first, end):
    """The events Determined's multiplexer gives for training workloads of one batch each,
    batches ``first`` to ``end - 1`` inside one epoch (``_MultiplexerBase.on_train_batch_begin``
    / ``on_train_batch_end``, ``TFKerasTrialController._post_train_batch_end``)."""
    lines = []
    for b in range(first, end):
        lines += [f"on_train_workload_begin:{b}:1", f"on_train_batch_begin:{b}"]
        lines += [f"on_train_batch_end:{b}", f"on_train_workload_end:{b + 1}"]
    return lines


#: A checkpoint workload: ``_save_checkpoint`` takes the states, then ``_checkpoint_end``.
CHECKPOINT = ["get_state", "on_checkpoint_end:True"]
#: A validation workload: Keras's ``on_test_begin``; ``on_test_end`` once evaluation is over,
#: with the ``val_`` metrics only (``_compute_validation_metrics``).
VALIDATION = ["on_test_begin", "on_test_end:['val_loss']"]


@pytest.mark.parametrize("preempt_at", [None, 4], ids=["straight", "resumed"])
def test_one_var_training(trial_env, preempt_at):
    """Ports ``TestKerasTrial.test_one_var_training`` (with and without a checkpoint in the
    middle): each batch's loss is the analytic loss of the current weight, and after a resume
    the weight goes on from the checkpoint's. As there, workloads of one batch and
    ``records_per_epoch: 100`` (no epoch ends); the callbacks get exactly the events Determined
    0.38.1's harness gives them for the same workloads (see ``one_batch_workloads``). Its
    ``[True]`` case checkpoints after 4 batches and ends (``on_train_end`` after ``get_state``):
    here the first run, preempted after batch 4 of 8."""
    _, registry = trial_env
    cfg = one_var_config(8 if preempt_at else 4, 1, event_log=True)
    cfg["records_per_epoch"] = 100
    _, result = run(trial_env, trials.OneVarTrial, cfg, preempt_at=preempt_at)
    first = trials.OneVarTrial.last_log.lines
    start = ["on_train_begin", "on_epoch_begin:0", *one_batch_workloads(0, 4)]
    if preempt_at:
        assert result.status == "preempted"
        assert first == [*start, *CHECKPOINT, "on_train_end"]  # Determined's [True] stream
        controller, result = run(trial_env, trials.OneVarTrial, cfg)
        # the resumed run goes on writing the log it saved, as CBChecker's load_state does; to
        # the end of max_length, where the searcher validates and the trial checkpoints
        rest = ["load_state", *one_batch_workloads(4, 8), *VALIDATION, *CHECKPOINT]
        assert trials.OneVarTrial.last_log.lines == [*start, "get_state", *rest, "on_train_end"]
    else:  # the searcher's validation and the final checkpoint at max_length
        assert first == [*start, *VALIDATION, *CHECKPOINT, "on_train_end"]
    assert result.batches_trained == (8 if preempt_at else 4)
    w, lr = 0.0, cfg["hyperparameters"]["learning_rate"]
    training = metrics(registry, 1, "training")
    assert [step for step, _ in training] == list(range(1, result.batches_trained + 1))
    passes = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]] * 2
    for (_, logs), batch in zip(training, passes, strict=False):
        assert logs["loss"] == pytest.approx(trials.OneVarTrial.calc_loss(w, batch), abs=1e-4)
        w -= lr * trials.OneVarTrial.calc_gradient(w, batch)


def check_event_order(lines):
    """Determined's callback checks: train begin/end bracket the run (a resume continues the
    log after ``get_state``), batches inside workloads, validations outside them, epochs
    alternate with indices counting up."""
    names = [line.split(":")[0] for line in lines]
    assert names[0] == "on_train_begin" and names[-1] == "on_train_end", names
    # once each: a resume's load_state replaces the log its on_train_begin went to, so a
    # load_state before on_train_begin (not Determined's order) would leave a second one
    assert names.count("on_train_begin") == names.count("on_train_end") == 1, names
    allowed = {
        "on_train_workload_begin": {"on_train_begin", "on_train_workload_end", "on_test_end"},
        "on_train_batch_begin": {"on_train_workload_begin", "on_train_batch_end"},
        "on_train_batch_end": {"on_train_batch_begin"},
        "on_train_workload_end": {"on_train_batch_end"},
        "on_test_begin": {"on_train_workload_end"},
        "on_test_end": {"on_test_begin"},
        "load_state": {"get_state"},
    }
    previous = None
    for i, name in enumerate(names):
        if name in allowed and name != "load_state":
            assert previous in allowed[name], (i, name, previous, lines)
        if name == "load_state":
            assert names[i - 1] == "get_state", (i, lines)
        if name in allowed or name in {"on_train_begin", "on_train_end"}:
            previous = name if name != "load_state" else "on_train_workload_end"
    epochs = [line for line in lines if line.startswith("on_epoch_")]
    for i, line in enumerate(epochs):
        kind, index = line.split(":")[:2]
        assert kind == ("on_epoch_begin" if i % 2 == 0 else "on_epoch_end"), epochs
        assert int(index) == i // 2, epochs


def test_callbacks(trial_env):
    """Ports ``TestKerasTrial.test_callbacks``: with ckptstore's TensorBoard,
    ReduceLROnPlateau and EarlyStopping(restore_best_weights=True) in the list, a recording
    callback sees every hook in Determined's order across a preemption and resume (with
    ``on_checkpoint_end`` after the states are taken), the expected
    number of epochs (records_per_epoch) and validations, and ``on_test_end`` gets the logs."""
    _, registry = trial_env
    cfg = one_var_config(75, 5, epochs=18, validations=4)
    cfg["min_validation_period"] = {"batches": 20}
    _, result = run(trial_env, trials.OneVarTrial, cfg, preempt_at=30)
    assert result.status == "preempted" and result.batches_trained == 30
    _, result = run(trial_env, trials.OneVarTrial, cfg)
    assert result.status == "completed" and result.batches_trained == 75
    lines = trials.OneVarTrial.last_log.lines
    check_event_order(lines)
    assert lines.count("load_state") == 1
    # the last checkpoint: callback states, then on_checkpoint_end with the written folder
    assert lines[-3:] == ["get_state", "on_checkpoint_end:True", "on_train_end"]
    # 75 batches of 3 records, 12 records per epoch: 4 batches an epoch, 18 whole epochs
    assert sum(line.startswith("on_epoch_end") for line in lines) == 18
    test_ends = [line for line in lines if line.startswith("on_test_end")]
    assert len(test_ends) == 4 and all("loss" in line for line in test_ends)  # 20, 40, 60, 75
    assert [step for step, _ in metrics(registry, 1, "validation")] == [20, 40, 60, 75]


ANCIENT_UUID = "0c12a3b4-5d6e-4f70-8a9b-0c1d2e3f4a5b"


def test_ancient_checkpoint_012_layout(trial_env):
    """Ports ``test_ancient_checkpoints[0.12.3]`` with our own files (Determined's stay in its
    repository): a Determined 0.12-era checkpoint is one HDF5 whole model named
    ``determined-keras-model`` (Keras 2, legacy SGD with its iteration count). A trial named
    it by UUID (here ``warm_start``, as ``searcher.source_checkpoint_uuid`` does) starts from
    its weight and optimizer state: the first batch's loss is the analytic loss of that weight."""
    import tf_keras

    storage, registry = trial_env
    old = tf_keras.Sequential(
        [tf_keras.Input((1,)), tf_keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
    )
    old.compile(tf_keras.optimizers.legacy.SGD(learning_rate=0.05), "mse")
    old.fit(np.array([[2.0]]), np.array([[1.0]]), epochs=1, verbose=0)  # w: 1 -> 0.6
    w = float(old.get_weights()[0][0][0])
    folder = os.path.join(storage, ANCIENT_UUID)
    os.makedirs(folder)
    old.save(os.path.join(folder, "determined-keras-model"), save_format="h5")
    cfg = one_var_config(1, 1)
    cfg["searcher"]["source_checkpoint_uuid"] = ANCIENT_UUID
    with ckptstore.core.init(
        storage=storage,
        registry=registry,
        trial_id=1,
        hparams=cfg["hyperparameters"],
        preempt_signals=False,
    ) as core_context:
        trials.PREEMPTION.update(preempt=core_context.preempt, at=None)
        controller = TrialController(
            trials.OneVarTrial,
            core_context,
            {"entrypoint": "model_def:OneVarTrial", **cfg},
            trial_seed=SEED,
            warm_start=ANCIENT_UUID,
        )
        controller.run()
    (_, logs), *_ = metrics(registry, 1, "training")
    assert logs["loss"] == pytest.approx(trials.OneVarTrial.calc_loss(w, [0, 1, 2]), abs=1e-5)
    assert int(keras.backend.get_value(controller.model.optimizer.iterations)) == 2


def test_surface_native_error(trial_env):
    """Ports ``test_surface_native_error``: Keras's own error about a model that cannot take its
    data reaches the caller unchanged."""
    cfg = {
        "hyperparameters": {"global_batch_size": 1},
        "searcher": {"name": "single", "metric": "val_accuracy", "max_length": {"batches": 2}},
    }
    with pytest.raises(ValueError, match="incompatible"):
        run(trial_env, trials.RuntimeErrorTrial, cfg)


def test_rng_restore(trial_env):
    """Ports ``test_rng_restore``: metrics drawn from Python's, NumPy's and TensorFlow's global
    generators after a resume equal an uninterrupted run's, whatever was seeded in between."""
    _, registry = trial_env
    cfg = {
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 5}},
        "min_validation_period": {"batches": 1},
        "scheduling_unit": 1,
        "checkpoint_policy": "none",
    }
    run(trial_env, trials.RandomMetricsTrial, cfg, trial_id=1)
    run(trial_env, trials.RandomMetricsTrial, cfg, trial_id=2, preempt_at=1)
    (
        random.seed(0),
        np.random.seed(0),
        tf.random.set_global_generator(tf.random.Generator.from_seed(0)),
    )
    run(trial_env, trials.RandomMetricsTrial, cfg, trial_id=2)
    straight, resumed = metrics(registry, 1, "validation"), metrics(registry, 2, "validation")
    assert len(straight) == 5 and resumed == straight
    assert len({m["val_rand_rand"] for _, m in straight}) == 5  # real draws, not a constant
    assert metrics(registry, 2, "training") == metrics(registry, 1, "training")


def test_keras_from_config():
    """Ports ``test_keras_from_config``: ``TFKerasTrialContext.from_config`` builds a trial
    outside an experiment; its model trains with plain ``fit`` to the analytic loss."""
    lr, n = 0.001, 10
    config = {
        "hyperparameters": {"global_batch_size": 1, "learning_rate": lr, "dataset_range": n},
        "searcher": {"metric": "val_loss"},
    }
    context = det.keras.TFKerasTrialContext.from_config(config)
    trial = trials.OneVarTrial(context)
    model = trial.build_model()
    model.fit(trial.build_training_data_loader(), verbose=0)
    loss = model.evaluate(trial.build_validation_data_loader(), verbose=0)
    w = 0.0
    for v in range(n):
        w -= lr * trials.OneVarTrial.calc_gradient(w, [v])
    assert loss == pytest.approx(trials.OneVarTrial.calc_loss(w, range(n)))
