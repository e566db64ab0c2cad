"""A GAN TFKerasTrial in the shape of Determined's DCGAN example (``gan_trial.py``): images-only
batches, a subclassed model holding two sub-models, custom ``train_step``/``test_step``, two
optimizers from ``context.wrap_optimizer``. It trains, gets a real SIGTERM mid-workload, resumes
bit-exactly (both sub-models, BatchNormalization statistics, both optimizers' slots and
iterations, metrics) and loads into a model the caller builds. Runs on Keras 3 and, through
``tests/keras_io/test_keras2_suite.py``, on Keras 2.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ckptstore
import ckptstore as det
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.registry import Registry
from tests.determined_compat import gan_trial
from tests.keras_io.keras_under_test import KERAS_MAJOR

pytestmark = pytest.mark.e2e

TOTAL = 12  # 2 passes of 48 images in batches of 8


def _config(data="dataset"):
    return {
        "entrypoint": "gan_trial:GanTrial",
        "hyperparameters": {"global_batch_size": 8, "generator_lr": 0.01, "discriminator_lr": 0.02},
        "searcher": {"name": "single", "metric": "val_d_loss", "max_length": {"batches": TOTAL}},
        "min_validation_period": {"batches": 6},
        "scheduling_unit": 3,
        "data": {"train": data},
    }


@pytest.fixture
def gan_env(tmp_path):
    registry = Registry(f"sqlite:///{tmp_path / 'reg.db'}")
    yield str(tmp_path / "ckpts"), registry
    gan_trial.SIGTERM_AT["batch"] = None
    registry.close()


def _run(gan_env, trial_id, cfg, sigterm_at=None):
    storage, registry = gan_env
    gan_trial.SIGTERM_AT["batch"] = sigterm_at
    with ckptstore.core.init(
        storage=storage, registry=registry, trial_id=trial_id, hparams=cfg["hyperparameters"]
    ) as core_context:  # real SIGTERM handlers (preempt_signals defaults to True)
        controller = TrialController(gan_trial.GanTrial, core_context, cfg, trial_seed=11)
        result = controller.run()
    gan_trial.SIGTERM_AT["batch"] = None
    return controller, result


def _state(model):
    """Every value training changes: both sub-models (BatchNormalization statistics too) and
    both wrapped optimizers, by name."""
    out = {f"w/{i}": np.asarray(v.numpy()) for i, v in enumerate(model.weights)}
    for which in ("generator_optimizer", "discriminator_optimizer"):
        found = getattr(model, which).variables
        for i, v in enumerate(found() if callable(found) else found):
            out[f"{which}/{i}"] = np.asarray(v.numpy())
    return out


def _metrics(registry, trial_id, kind):
    return [(m.steps_completed, m.metrics) for m in registry.get_metrics(trial_id, kind)]


@pytest.mark.parametrize("data", ["dataset", "tuple1"])
def test_gan_trial_sigterm_resumes_exactly_and_loads(gan_env, data):
    storage, registry = gan_env
    cfg = _config(data)
    straight, result = _run(gan_env, 1, cfg)
    assert result.status == "completed" and result.batches_trained == TOTAL
    _, result = _run(gan_env, 2, cfg, sigterm_at=4)
    assert result.status == "preempted" and result.batches_trained == 4
    resumed, result = _run(gan_env, 2, cfg)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 4
    want, got = _state(straight.model), _state(resumed.model)
    assert sorted(want) == sorted(got)
    for key in want:
        np.testing.assert_array_equal(want[key], got[key], err_msg=key)
    # each wrapped optimizer took its own 12 steps; Keras's default one none
    assert int(np.asarray(resumed.model.generator_optimizer.iterations)) == TOTAL
    # the workloads after the first resumed one cover the same batches: the same losses
    want_training = [m for m in _metrics(registry, 1, "training") if m[0] > 6]
    assert [m for m in _metrics(registry, 2, "training") if m[0] > 6] == want_training
    assert _metrics(registry, 2, "validation") == _metrics(registry, 1, "validation")

    # The checkpoint has no full model (TinyGan cannot be rebuilt from a config): it loads
    # into a model the caller builds, weights and both optimizers.
    checkpoint = registry.latest_checkpoint(2)
    context = det.keras.TFKerasTrialContext(cfg["hyperparameters"], experiment_config=cfg)
    model = gan_trial.GanTrial(context).build_model()
    loaded = det.keras.load_model_from_checkpoint_path(
        os.path.join(storage, checkpoint.uuid), model=model
    )
    assert loaded is model
    for key, value in _state(straight.model).items():
        np.testing.assert_array_equal(value, _state(loaded)[key], err_msg=key)
    x = gan_trial.images(4, 3)
    np.testing.assert_array_equal(
        np.asarray(straight.model(x)), np.asarray(loaded(x)), err_msg="predictions"
    )
    # Without model=: the trial class its metadata names, from a module this process already
    # imported (nothing new is imported), builds the model.
    built = det.keras.load_model_from_checkpoint_path(os.path.join(storage, checkpoint.uuid))
    assert isinstance(built, gan_trial.TinyGan)
    np.testing.assert_array_equal(np.asarray(straight.model(x)), np.asarray(built(x)))


def test_weights_only_trial_checkpoint_never_imports_an_unimported_trial_module(tmp_path):
    """A weights-only TFKerasTrial checkpoint naming a trial class in a module this process
    has not imported is refused (UntrustedCode, nothing imported) unless allowed; one naming
    none gets a ModelLoadError saying to pass model=."""
    import sys

    from ckptstore.keras_io.trial import model_part

    (tmp_path / model_part.SEQUENCER_FILENAME).write_text("{}")
    (tmp_path / "metadata.json").write_text(json.dumps({"trial_class": "this:Trial"}))
    sys.modules.pop("this", None)
    with pytest.raises(det.errors.UntrustedCode, match="modules=\\['this'\\]"):
        model_part.build_trial_model(str(tmp_path))
    assert "this" not in sys.modules
    (tmp_path / "metadata.json").write_text("{}")
    with pytest.raises(det.errors.ModelLoadError, match="model=model"):
        model_part.build_trial_model(str(tmp_path))


def test_gan_checkpoint_records_what_is_missing(gan_env):
    """The first checkpoint commits weights and optimizer states; its metadata says the full
    model is missing and why, and one warning names the fix."""
    storage, registry = gan_env
    cfg = _config()
    cfg["searcher"]["max_length"] = {"batches": 3}
    with pytest.warns(UserWarning, match="get_config") as caught:
        _run(gan_env, 1, cfg)
    assert len([w for w in caught if "get_config" in str(w.message)]) == 1
    checkpoint = registry.latest_checkpoint(1)
    missing = checkpoint.metadata["missing"]
    assert "model" in missing[0]["what"] and "TinyGan" in missing[0]["why"]
    assert KERAS_MAJOR in (2, 3)
