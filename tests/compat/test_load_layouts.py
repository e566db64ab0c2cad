"""``det.keras.load_model_from_checkpoint_path(path, tags)`` reads every layout
``ckptstore import-determined`` reads: checkpoints written by real Keras 2 (``tf_keras``) the way
Determined's ``DeterminedCallback`` and ``TFKerasTrial`` (current and 0.17-era HDF5) wrote them,
with the model built by the trial class saved in ``code/`` (as Determined's loader did) or passed
as ``model=``; and ckptstore's own checkpoints."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.import_determined import layouts
from tests.import_determined import tf_keras_fixtures as tk

pytestmark = pytest.mark.e2e  # trains Keras 2 (tf_keras) models end to end

CASE = tk.OPTIMIZERS["adam"] if "adam" in tk.OPTIMIZERS else next(iter(tk.OPTIMIZERS.values()))

# The user's TFKerasTrial, migrated to `import ckptstore as det`, as saved in a checkpoint's code/.
MODEL_DEF = textwrap.dedent(
    """
    import keras
    import ckptstore as det


    class TinyTrial(det.keras.TFKerasTrial):
        def __init__(self, context: det.keras.TFKerasTrialContext) -> None:
            self.context = context

        def build_model(self):
            model = keras.Sequential([
                keras.Input((3,)),
                keras.layers.Dense(self.context.get_hparam("units"), activation="tanh"),
                keras.layers.Dense(2),
            ])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
            return model

        def build_training_data_loader(self) -> det.keras.InputData:
            raise NotImplementedError

        def build_validation_data_loader(self) -> det.keras.InputData:
            raise NotImplementedError
    """
)


@pytest.fixture(scope="module")
def trained():
    return tk.train_tf_keras(CASE)


def predictions(model) -> np.ndarray:
    x, _ = tk.next_batch()
    return np.asarray(model(x))


# Determined 0.17's examples assigned cluster fields of context.env in the trial's __init__.
MODEL_DEF_017 = MODEL_DEF.replace(
    "self.context = context\n",
    "self.context = context\n        self.context.env.container_gpus = []\n",
)
assert MODEL_DEF_017 != MODEL_DEF


def with_code(folder: str, *, old_style: bool) -> None:
    """Add the trial's code and the file naming it: load_data.json, or for checkpoints of
    Determined <= 0.17.7 the metadata.json Checkpoint.download() wrote."""
    os.makedirs(os.path.join(folder, "code"), exist_ok=True)
    with open(os.path.join(folder, "code", "tiny_model_def.py"), "w") as f:
        f.write(MODEL_DEF_017 if old_style else MODEL_DEF)
    config = {"entrypoint": "tiny_model_def:TinyTrial", "hyperparameters": {"units": 4}}
    if old_style:
        path = os.path.join(folder, "metadata.json")
        metadata = json.load(open(path)) if os.path.exists(path) else {}
        metadata.update({"experiment_config": config, "hparams": {"units": 4}})
        json.dump(metadata, open(path, "w"))
    else:
        load_data = {
            "trial_type": "TFKerasTrial",
            "trial_cls_spec": "tiny_model_def:TinyTrial",
            "hparams": {"units": 4},
            "experiment_config": config,
        }
        json.dump(load_data, open(os.path.join(folder, "load_data.json"), "w"))


@pytest.mark.parametrize("layout", sorted(tk.SAVERS))
def test_every_import_determined_layout_loads_with_model(layout, trained, tmp_path):
    folder = str(tmp_path / layout)
    tk.SAVERS[layout](trained, folder)
    assert layouts.detect_layout(os.listdir(folder)) == layout  # what import-determined sees
    model = tk.build_keras3_model(CASE.keras3(CASE.learning_rate))
    loaded = det.keras.load_model_from_checkpoint_path(folder, None, model=model)
    assert loaded is model
    np.testing.assert_allclose(predictions(loaded), predictions(trained), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("old_style", [False, True], ids=["load_data.json", "0.17-metadata.json"])
def test_tfkeras_trial_layout_builds_the_model_from_its_code(old_style, trained, tmp_path):
    folder = str(tmp_path / "ckpt")
    tk.save_tfkeras_trial_checkpoint(trained, folder)
    if old_style:
        os.remove(os.path.join(folder, "load_data.json"))
    with_code(folder, old_style=old_style)
    # The checkpoint's code runs only when the caller trusts it: refused, nothing imported.
    sys.modules.pop("tiny_model_def", None)
    with pytest.raises(errors.UntrustedCode, match="trust_code=True"):
        det.keras.load_model_from_checkpoint_path(folder)
    assert "tiny_model_def" not in sys.modules
    model = det.keras.load_model_from_checkpoint_path(folder, trust_code=True)
    np.testing.assert_allclose(predictions(model), predictions(trained), rtol=1e-5, atol=1e-6)


def test_017_era_h5_checkpoint_without_code_is_read_by_keras(trained, tmp_path):
    folder = str(tmp_path / "h5")
    tk.save_h5_model_checkpoint(trained, folder)
    model = det.keras.load_model_from_checkpoint_path(folder, ["serve"])
    np.testing.assert_allclose(predictions(model), predictions(trained), rtol=1e-5, atol=1e-6)


def test_weights_only_layouts_without_code_say_to_pass_the_model(trained, tmp_path):
    folder = str(tmp_path / "cb")
    tk.save_callback_checkpoint(trained, folder)
    with pytest.raises(errors.ModelLoadError, match="model=model"):
        det.keras.load_model_from_checkpoint_path(folder)
    folder = str(tmp_path / "trial")
    tk.save_tfkeras_trial_checkpoint(trained, folder)  # load_data.json names model_def:Trial
    with pytest.raises(errors.UntrustedCode, match="model=model"):  # its code/ is not run
        det.keras.load_model_from_checkpoint_path(folder)
    with pytest.raises(errors.ModelLoadError, match="model=model"):  # trusted: no such class
        det.keras.load_model_from_checkpoint_path(folder, trust_code=True)


def test_ckptstore_checkpoint_and_tags(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    os.makedirs(tmp_path / "mine")
    model.save(str(tmp_path / "mine" / "model.keras"))
    loaded = det.keras.load_model_from_checkpoint_path(tmp_path / "mine", ["serve"])
    np.testing.assert_allclose(predictions(loaded), predictions(model))
    with pytest.raises(errors.ModelLoadError, match="'serve'"):
        det.keras.load_model_from_checkpoint_path(tmp_path / "mine", ["train"])
    with pytest.raises(errors.InvalidConfig, match="tag strings"):
        det.keras.load_model_from_checkpoint_path(tmp_path / "mine", False)
