"""The trial controller on real local storage and a SQLite registry: every data type trains,
workloads and hooks follow the schedule, and a preempted trial resumes exactly."""

import numpy as np
import pytest

import ckptstore
from ckptstore import errors
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.registry import Registry
from tests.keras_io.trial.tiny_trial import TinyTrial

pytestmark = pytest.mark.e2e  # trains Keras models end to end


def config(max_batches=10, val=5, ckpt=None, unit=3, **extra):
    raw = {
        "hyperparameters": {"global_batch_size": 16, "data_type": "arrays"},
        "searcher": {
            "name": "single",
            "metric": "val_accuracy",
            "smaller_is_better": False,
            "max_length": {"batches": max_batches},
        },
        "min_validation_period": {"batches": val},
        "scheduling_unit": unit,
        "entrypoint": "tiny_trial:TinyTrial",
    }
    if ckpt:
        raw["min_checkpoint_period"] = {"batches": ckpt}
    raw.update(extra)
    return raw


@pytest.fixture
def tiny_trial_env(tmp_path):
    storage = str(tmp_path / "ckpts")
    registry = Registry(f"sqlite:///{tmp_path / 'reg.db'}")
    yield storage, registry
    TinyTrial.preempt = TinyTrial.preempt_at = TinyTrial.last_counter = None
    registry.close()


def run_trial(tiny_trial_env, trial_id, data_type, cfg, preempt_at=None):
    storage, registry = tiny_trial_env
    with ckptstore.core.init(
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        hparams={"global_batch_size": 16, "data_type": data_type},
        preempt_signals=False,
    ) as core_context:
        TinyTrial.preempt = core_context.preempt
        TinyTrial.preempt_at = preempt_at
        controller = TrialController(TinyTrial, core_context, cfg, trial_seed=3)
        result = controller.run()
    return controller, result


DATA_TYPES = [
    "arrays",
    "arrays_weights",
    "dataset",
    "pydataset",
    "adapter_threads",
    "adapter_processes",
    "in_memory",
]


@pytest.mark.parametrize("data_type", DATA_TYPES)
def test_each_data_type_trains(tiny_trial_env, data_type):
    _, registry = tiny_trial_env
    # checkpoint_policy none: only the end checkpoint (test_checkpoint_policy covers the others)
    controller, result = run_trial(tiny_trial_env, 1, data_type, config(checkpoint_policy="none"))
    assert result.status == "completed" and result.batches_trained == 10
    assert set(result.last_validation) == {"val_loss", "val_accuracy"}
    counter = TinyTrial.last_counter
    assert counter.batches == 10
    assert counter.workloads == [(0, 3), (3, 2), (5, 3), (8, 2)]
    assert counter.checkpoints == 1  # only at the end: no min_checkpoint_period
    steps = [m.steps_completed for m in registry.get_metrics(1, "validation")]
    assert steps == [5, 10]
    assert [m.steps_completed for m in registry.get_metrics(1, "training")] == [3, 5, 8, 10]
    latest = registry.latest_checkpoint(1)
    assert latest.steps_completed == 10 and latest.uuid == result.latest_checkpoint
    assert latest.metrics["validation_metrics"]["val_accuracy"] == result.searcher_metric
    if data_type == "pydataset":
        # 64 records / 16 = 4 batches per pass: passes end after batches 4 and 8
        assert controller.train_data.adapter.sequence.epochs_ended == 2


def model_state(model):
    values = [v.numpy() for v in model.weights]
    values += [v.numpy() for v in model.optimizer.variables]
    return values


@pytest.mark.parametrize("data_type", ["arrays", "in_memory", "adapter_threads", "dataset"])
def test_preempted_trial_resumes_exactly(tiny_trial_env, data_type):
    _, registry = tiny_trial_env
    cfg = config(max_batches=12, val=4, ckpt=None, unit=2)
    straight, _ = run_trial(tiny_trial_env, 1, data_type, cfg)

    first, result = run_trial(tiny_trial_env, 2, data_type, cfg, preempt_at=6)
    assert result.status == "preempted" and result.batches_trained == 6
    assert registry.latest_checkpoint(2).steps_completed == 6
    resumed, result = run_trial(tiny_trial_env, 2, data_type, cfg)
    assert result.status == "completed" and result.batches_trained == 12
    assert TinyTrial.last_counter.batches == 12  # callback state survived
    # Determined's order: on_train_begin first, then load_state (a reset cannot undo the state)
    assert TinyTrial.last_counter.hooks == ["on_train_begin", "load_state"]
    assert TinyTrial.last_counter.workloads[0] == (6, 2)  # continued at the next batch
    assert int(resumed.model.optimizer.iterations.numpy()) == 12
    for a, b in zip(model_state(straight.model), model_state(resumed.model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [m.steps_completed for m in registry.get_metrics(2, "validation")] == [4, 8, 12]


@pytest.mark.parametrize("policy", ["best", "all", "none", None])
def test_checkpoint_policy(tiny_trial_env, policy):
    """Determined's rule: after a validation, ``best`` checkpoints when the searcher metric beats
    every earlier validation of the experiment, ``all`` always, ``none`` never; the end of
    training is checkpointed under each. No ``checkpoint_policy`` means ``best``."""
    _, registry = tiny_trial_env
    extra = {} if policy is None else {"checkpoint_policy": policy}
    cfg = config(max_batches=8, val=2, unit=2, **extra)
    experiment = registry.create_experiment(config=cfg)
    registry.create_trial(experiment_id=experiment, trial_id=1)
    # Another trial of the experiment already holds a validation: `best` must beat it.
    registry.create_trial(experiment_id=experiment, trial_id=2)
    registry.report_metrics(2, "validation", 1, {"val_accuracy": 0.7})
    with ckptstore.core.init(
        storage=tiny_trial_env[0],
        registry=registry,
        trial_id=1,
        experiment_id=experiment,
        hparams={"global_batch_size": 16, "data_type": "arrays"},
        preempt_signals=False,
    ) as core_context:
        TrialController(TinyTrial, core_context, cfg, trial_seed=3).run()
    validations = [
        (m.steps_completed, m.metrics["val_accuracy"])
        for m in registry.get_metrics(1, "validation")
    ]
    assert [step for step, _ in validations] == [2, 4, 6, 8]
    best, improved = 0.7, {8}
    for step, value in validations:
        if value > best:
            best = value
            improved.add(step)
    # seed 3 gives 0.67, 0.70, 0.72, 0.72: `best` is neither `all` nor `none` here
    assert improved == {4, 6, 8}
    expected = {"best": improved, None: improved, "all": {2, 4, 6, 8}, "none": {8}}[policy]
    assert {c.steps_completed for c in registry.list_checkpoints(1)} == expected


def test_stop_training_from_a_callback_ends_with_validation_and_checkpoint(tiny_trial_env):
    _, registry = tiny_trial_env

    class Stopper(TinyTrial):
        def keras_callbacks(self):
            import keras

            class Stop(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None):
                    if self.model.optimizer.iterations.numpy() >= 4:
                        self.model.stop_training = True

            return [Stop()]

    with ckptstore.core.init(
        storage=tiny_trial_env[0],
        registry=registry,
        trial_id=5,
        hparams={"global_batch_size": 16, "data_type": "arrays"},
        preempt_signals=False,
    ) as core_context:
        result = TrialController(Stopper, core_context, config(max_batches=20, val=10)).run()
    assert result.status == "stopped_early" and result.batches_trained == 4
    assert registry.latest_checkpoint(5).steps_completed == 4
    assert [m.steps_completed for m in registry.get_metrics(5, "validation")] == [4]


def test_wrong_searcher_metric_is_reported(tiny_trial_env):
    with pytest.raises(errors.InvalidConfig, match="searcher.metric 'val_f1'.*val_accuracy"):
        cfg = config()
        cfg["searcher"]["metric"] = "val_f1"
        run_trial(tiny_trial_env, 1, "arrays", cfg)


def test_bad_data_loader_type(tiny_trial_env):
    class BadData(TinyTrial):
        def build_training_data_loader(self):
            return [1, 2, 3, 4]

    with ckptstore.core.init(
        storage=tiny_trial_env[0],
        registry=tiny_trial_env[1],
        trial_id=1,
        hparams={"global_batch_size": 16, "data_type": "arrays"},
        preempt_signals=False,
    ) as core_context:
        with pytest.raises(errors.InvalidConfig, match="returned a list.*tf.data.Dataset"):
            TrialController(BadData, core_context, config()).run()


def test_keras3_refuses_graph_mode(tiny_trial_env, monkeypatch):
    """A module that called tf.compat.v1.disable_eager_execution() cannot train on Keras 3: a
    typed error names Keras 2 (which trains it: tests/keras_io/test_graph_mode_keras2.py). Graph
    mode is reported on here, since the real switch cannot be turned back in this process."""
    from ckptstore.keras_io import backend

    monkeypatch.setattr(backend, "graph_mode", lambda: True)
    with pytest.raises(errors.NotSupported, match="disable_eager_execution.*LEGACY_KERAS=1"):
        run_trial(tiny_trial_env, 1, "arrays", config())
