"""TFKerasTrial on whichever Keras ``tf.keras`` is: this module runs in the normal (Keras 3)
session and again under ``TF_USE_LEGACY_KERAS=1`` (Keras 2 / tf_keras) through
``tests/keras_io/test_keras2_suite.py``.

The trial (``tests/keras_io/legacy_trial_model_def.py``) is a Determined-style model_def; on
Keras 2 it compiles a tf_keras ``Sequential`` with ``tf.keras.optimizers.legacy.RMSprop`` (or a
Keras 2.11+ ``Adam``) and positional metrics. Each case trains straight through, then preempts a
second trial after some batch (at a workload boundary or inside a workload, where the controller
checkpoints after that batch) and resumes it from its checkpoint: the resumed weights and
optimizer variables must equal the straight run's exactly. The last test runs the model_def
through the experiment runner (``entrypoint: model_def:LegacyOptTrial``, a trial subprocess).
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest

import ckptstore
from ckptstore import errors
from ckptstore.keras_io.trial import model_part
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.registry import Registry
from tests.keras_io import legacy_trial_model_def as model_def
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras, optimizer_variables
from tests.keras_io.legacy_trial_model_def import LegacyOptTrial

pytestmark = pytest.mark.e2e  # trains Keras models end to end

TOTAL = 12  # batches: 2 passes of 48 records / 8


def _config(**extra):
    raw = {
        "hyperparameters": {"global_batch_size": 8, "lr": 0.01, "optimizer": "legacy"},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": TOTAL}},
        "min_validation_period": {"batches": 4},
        "scheduling_unit": 2,
        "entrypoint": "model_def:LegacyOptTrial",
    }
    raw.update(extra)
    return raw


@pytest.fixture
def legacy_trial_env(tmp_path):
    registry = Registry(f"sqlite:///{tmp_path / 'reg.db'}")
    yield str(tmp_path / "ckpts"), registry
    LegacyOptTrial.preempt = LegacyOptTrial.preempt_at = LegacyOptTrial.last_counter = None
    registry.close()


def _run(legacy_trial_env, trial_id, hparams, preempt_at=None):
    storage, registry = legacy_trial_env
    with ckptstore.core.init(
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        hparams={"global_batch_size": 8, "lr": 0.01, **hparams},
        preempt_signals=False,
    ) as core_context:
        LegacyOptTrial.preempt = core_context.preempt
        LegacyOptTrial.preempt_at = preempt_at
        controller = TrialController(LegacyOptTrial, core_context, _config(), trial_seed=7)
        result = controller.run()
        files = None
        if result.latest_checkpoint:
            with core_context.checkpoint.restore_path(result.latest_checkpoint) as path:
                files = set(os.listdir(path))
    return controller, result, files


def _state(model):
    # by position: Keras 2 names a second model's layers dense_2, dense_3, ...
    out = {f"w/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.weights)}
    out.update(
        {f"opt/{i}": np.asarray(v.numpy()) for i, v in enumerate(optimizer_variables(model))}
    )
    return out


# (optimizer, training data, preempted after batch): 6 batches a pass, workloads of 2
CASES = [
    ("legacy", "arrays", 4),  # a workload boundary inside a pass
    ("legacy", "in_memory", 6),  # the end of a pass (epoch)
    ("legacy", "dataset", 5),  # inside a workload: the controller stops after that batch
    ("legacy", "sequence", 3),
    ("new", "arrays", 6),
]
#: Cases whose model is a stateful LSTM: its carried states (which neither Keras saves with the
#: weights) must survive the preemption inside an epoch, or batch 4 starts from zero states.
#: Not the dataset case: its validation data reshuffles on every pass, and a stateful model's
#: metrics depend on the order of the batches (the resumed run's first pass is the straight
#: run's second).
STATEFUL_RNN = {("legacy", "sequence", 3)}


@pytest.mark.parametrize(("optimizer", "data", "preempt_at"), CASES)
def test_trial_checkpoints_and_resumes_exactly(legacy_trial_env, optimizer, data, preempt_at):
    _, registry = legacy_trial_env
    hparams = {"optimizer": optimizer, "data": data}
    if (optimizer, data, preempt_at) in STATEFUL_RNN:
        hparams["stateful_rnn"] = True
    straight, result, files = _run(legacy_trial_env, 1, hparams)
    assert result.status == "completed" and result.batches_trained == TOTAL
    assert set(result.last_validation) == {"val_loss", "val_mae"}
    opt = straight.model.optimizer
    if KERAS_MAJOR == 2:
        assert type(straight.model).__module__.startswith("tf_keras.")
        legacy = type(opt).__module__.startswith("tf_keras.src.optimizers.legacy")
        assert legacy == (optimizer == "legacy"), type(opt)
        assert {"model_checkpoint.index", "model_config.json"} <= files
        assert "model.keras" not in files
    else:
        assert "model.keras" in files
    assert {"callback_state.json", "workload_sequencer.json", "metadata.json"} <= files

    first, result, _ = _run(legacy_trial_env, 2, hparams, preempt_at=preempt_at)
    assert result.status == "preempted" and result.batches_trained == preempt_at
    assert registry.latest_checkpoint(2).steps_completed == preempt_at
    # the preempted run has trained less than the straight one: the comparison below is real
    assert not np.array_equal(_state(first.model)["w/0"], _state(straight.model)["w/0"])

    resumed, result, _ = _run(legacy_trial_env, 2, hparams)
    assert result.status == "completed" and result.batches_trained == TOTAL
    assert resumed.context.get_initial_batch() == preempt_at
    counter = LegacyOptTrial.last_counter
    assert (counter.batches, counter.epochs) == (TOTAL, 2)  # callback state survived
    assert int(keras.backend.get_value(resumed.model.optimizer.iterations)) == TOTAL
    want, got = _state(straight.model), _state(resumed.model)
    assert sorted(want) == sorted(got)
    assert sum(k.startswith("opt/") for k in got) > len(straight.model.weights)  # slots + iter
    for key in want:
        np.testing.assert_array_equal(want[key], got[key], err_msg=key)
    if hparams.get("stateful_rnn"):  # the carried states too, which live outside the weights
        assert "callback_arrays.npz" in files
        lstm = [m.layers[-2] for m in (straight.model, resumed.model)]
        assert all(layer.stateful for layer in lstm)
        for want_s, got_s in zip(*(layer.states for layer in lstm), strict=True):
            assert np.any(want_s.numpy())  # carried, not zeros
            np.testing.assert_array_equal(want_s.numpy(), got_s.numpy())
    # same weights, so the same metrics (up to the evaluation's float summation order)
    assert result.last_validation == pytest.approx(straight.last_validation, rel=1e-6)
    assert [m.steps_completed for m in registry.get_metrics(2, "validation")] == [4, 8, 12]


def test_trial_checkpoint_loads_compiled_with_its_optimizer_state(legacy_trial_env):
    storage, registry = legacy_trial_env
    hparams = {"optimizer": "legacy", "data": "arrays", "custom_layer": True}
    trained, result, files = _run(legacy_trial_env, 1, hparams)
    x = model_def.make_data(3)[0][:5]
    loaded = ckptstore.load_checkpoint_model(
        checkpoint_uuid=result.latest_checkpoint,
        storage=storage,
        registry=registry,
        custom_objects={"Scale": model_def.Scale},
    )
    # compiled as trained, with the optimizer's slots and iterations restored (Keras 2 too)
    assert loaded.optimizer is not None and type(loaded.optimizer) is type(trained.model.optimizer)
    assert len(optimizer_variables(loaded)) == len(optimizer_variables(trained.model))
    for want, got in zip(_state(trained.model).values(), _state(loaded).values(), strict=True):
        np.testing.assert_array_equal(want, got)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), trained.model.predict(x, verbose=0))
    assert ("training_config.json" in files) == (KERAS_MAJOR == 2)
    if KERAS_MAJOR == 2:
        _refuses_classes_from_other_modules(legacy_trial_env, result.latest_checkpoint)
    # The class comes from the caller, or from a module this process already imported (the
    # trial's own: nothing new is imported, issue 38 #7); a module not imported is refused
    # before anything is imported, the message naming the custom_objects fix.
    module = sys.modules.pop(model_def.Scale.__module__)
    try:
        with pytest.raises(errors.UntrustedCode, match="custom_objects"):
            ckptstore.load_checkpoint_model(
                checkpoint_uuid=result.latest_checkpoint, storage=storage, registry=registry
            )
        assert model_def.Scale.__module__ not in sys.modules
    finally:
        sys.modules[model_def.Scale.__module__] = module
    again = ckptstore.load_checkpoint_model(
        checkpoint_uuid=result.latest_checkpoint, storage=storage, registry=registry
    )
    np.testing.assert_allclose(again.predict(x, verbose=0), trained.model.predict(x, verbose=0))


def _refuses_classes_from_other_modules(legacy_trial_env, uuid):
    """A training_config.json naming a class of another module is refused before anything
    imports that module (``this`` prints the Zen of Python when imported)."""
    import json
    import sys

    from ckptstore.keras_io.saving import _keras2_format as keras2_format

    storage, registry = legacy_trial_env
    folder = os.path.join(os.path.dirname(storage), "tampered")
    with ckptstore.core.init(storage=storage, registry=registry, trial_id=1) as ctx:
        with ctx.checkpoint.restore_path(uuid) as path:
            shutil.copytree(path, folder)  # local restore paths are the stored files
    file = os.path.join(folder, "training_config.json")
    training = json.load(open(file))
    training["optimizer_config"].update(module="this", registered_name="Evil")
    json.dump(training, open(file, "w"))
    with pytest.raises(errors.UntrustedCode, match=r"module 'this'"):
        keras2_format.load_model(folder, compile=True, custom_objects={"Scale": model_def.Scale})
    assert "this" not in sys.modules


def test_checkpoint_of_the_other_keras_is_refused(legacy_trial_env, tmp_path):
    storage, registry = legacy_trial_env
    _, result, _ = _run(
        legacy_trial_env, 1, {"optimizer": "legacy", "data": "arrays"}, preempt_at=4
    )
    with ckptstore.core.init(storage=storage, registry=registry, trial_id=1) as ctx:
        with ctx.checkpoint.restore_path(result.latest_checkpoint) as path:
            copy = tmp_path / "copy"
            shutil.copytree(path, copy)
    # make the checkpoint look written by the other Keras: only the other layout's file
    for name in os.listdir(copy):
        if name.startswith("model_checkpoint") or name == "model.keras":
            os.remove(copy / name)
    (copy / ("model.keras" if KERAS_MAJOR == 2 else "model_checkpoint.index")).write_bytes(b"")
    with ckptstore.core.init(storage=storage, registry=registry, trial_id=1) as ctx:
        controller = TrialController(LegacyOptTrial, ctx, _config())
        controller._build()
        with pytest.raises(errors.ResumeError, match="TF_USE_LEGACY_KERAS"):
            model_part.check_layout(str(copy), "copy")


def test_model_def_runs_through_the_experiment_runner(tmp_path, monkeypatch):
    from ckptstore.experiment import create_experiment, describe_experiment

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", repo)  # TF_USE_LEGACY_KERAS passes through as it is
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(model_def.__file__, model_dir / "model_def.py")
    storage, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    # checkpoint_policy none: only the periodic and end checkpoints (`best` adds validations')
    raw = _config(min_checkpoint_period={"batches": 6}, checkpoint_policy="none")
    raw["hyperparameters"]["data"] = "in_memory"
    exp_id = create_experiment(raw, model_dir, storage=storage, registry=registry)
    info = describe_experiment(exp_id, registry=registry)
    assert info["state"] == "COMPLETED", info
    (trial,) = info["trials"]
    assert trial["state"] == "COMPLETED" and trial["batches_trained"] == TOTAL
    with Registry(registry) as reg:
        ckpts = reg.checkpoint_records(trial_id=trial["id"], states=None)
        assert sorted(c.steps_completed for c in ckpts) == [6, 12]
        meta = reg.get_checkpoint(info["best_checkpoint"]).metadata
    assert meta["keras_version"].split(".")[0] == str(KERAS_MAJOR)
    assert "val_loss" in meta["metrics"]["validation_metrics"]
