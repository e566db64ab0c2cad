"""Real Keras 2 (tf_keras) checkpoints in Determined's layouts, loaded into Keras 3.

The proof that optimizer state carried over: after loading, one more training step in Keras 3
gives the same weights and optimizer state as one more step in tf_keras on the same batch.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.import_determined import layouts
from ckptstore.import_determined.weights import (
    is_new_layout_h5,
    load_determined_checkpoint,
    load_h5_optimizer_file,
    nadam_u_product,
)
from tests.import_determined import tf_keras_fixtures as tk

pytestmark = pytest.mark.e2e  # trains Keras 2 (tf_keras) models end to end

pytest.importorskip("tf_keras", reason="tf_keras is not installed: pip install -e .[test]")

LAYOUTS = tuple(tk.SAVERS)
WRONG_LR_FACTOR = 7.0  # Keras 3 is compiled with this times the trained rate; loading restores it


class Trained:
    """A tf_keras model trained with one optimizer, saved in every layout, plus one more step."""

    def __init__(self, case: tk.OptimizerCase, root: str, *, batch_norm: bool = False) -> None:
        self.case = case
        self.batch_norm = batch_norm
        model = tk.train_tf_keras(case, batch_norm=batch_norm)
        self.folders = {
            layout: saver(model, os.path.join(root, layout)) for layout, saver in tk.SAVERS.items()
        }
        self.weights = [np.asarray(w) for w in model.weights]
        self.state = tk.optimizer_state(model, case)
        self.iterations = int(model.optimizer.iterations.numpy())
        self.scalars = {name: np.asarray(getattr(model.optimizer, name)) for name in case.scalars}
        model.train_on_batch(*tk.next_batch())  # the step Keras 3 must reproduce
        self.weights_after = [np.asarray(w) for w in model.weights]
        self.state_after = tk.optimizer_state(model, case)


_CACHE: dict[tuple[str, bool], Trained] = {}


def trained(case_name: str, tmp_path_factory, *, batch_norm: bool = False) -> Trained:
    key = (case_name, batch_norm)
    if key not in _CACHE:
        root = str(tmp_path_factory.mktemp(f"tfk-{case_name}"))
        _CACHE[key] = Trained(tk.OPTIMIZERS[case_name], root, batch_norm=batch_norm)
    return _CACHE[key]


def keras3_model(case: tk.OptimizerCase, *, lr_factor: float = 1.0, batch_norm: bool = False):
    return tk.build_keras3_model(case.keras3(case.learning_rate * lr_factor), batch_norm=batch_norm)


def assert_state(model, expected: dict[str, list[np.ndarray]], **tolerance) -> None:
    for attr, values in expected.items():
        got = getattr(model.optimizer, attr)
        assert len(got) == len(values), attr
        for i, (variable, value) in enumerate(zip(got, values, strict=True)):
            assert np.any(value), f"{attr}[{i}] is all zeros: the fixture proves nothing"
            if tolerance:
                np.testing.assert_allclose(np.asarray(variable), value, err_msg=attr, **tolerance)
            else:
                np.testing.assert_array_equal(np.asarray(variable), value, err_msg=attr)


def assert_weights(model, expected: list[np.ndarray], **tolerance) -> None:
    assert len(model.weights) == len(expected)
    for variable, value in zip(model.weights, expected, strict=True):
        if tolerance:
            np.testing.assert_allclose(np.asarray(variable), value, **tolerance)
        else:
            np.testing.assert_array_equal(np.asarray(variable), value)


TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
LOGGER = "ckptstore.import_determined.weights"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case_name", list(tk.OPTIMIZERS))
def test_keras2_checkpoint_continues_identically_in_keras3(layout, case_name, tmp_path_factory):
    run = trained(case_name, tmp_path_factory)
    model = keras3_model(run.case, lr_factor=WRONG_LR_FACTOR)
    result = load_determined_checkpoint(model, run.folders[layout])

    assert result.layout == layout
    assert result.optimizer_layout == ("legacy" if run.case.legacy else "keras_2_11")
    assert result.weights_loaded == len(run.weights)
    assert_weights(model, run.weights)
    assert_state(model, run.state)
    assert result.iterations == run.iterations == tk.TRAIN_STEPS
    assert int(model.optimizer.iterations.numpy()) == run.iterations
    # the trained learning rate replaced the (wrong) compiled one
    assert result.learning_rate == pytest.approx(run.case.learning_rate)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(run.case.learning_rate)
    slot_count = sum(len(v) for v in run.state.values())
    # + iterations, learning rate, scalars (Nadam's u_product)
    assert result.optimizer_variables_loaded == slot_count + 2 + len(run.case.scalars)
    if layout in layouts.H5_LAYOUTS and run.case.scalars:  # whole-model HDF5 files
        _assert_rebuilt_u_product(model, run)
        return  # see _assert_rebuilt_u_product
    for scalar in run.case.scalars:
        np.testing.assert_allclose(
            np.asarray(getattr(model.optimizer, scalar)), run.scalars[scalar], rtol=1e-6
        )

    if not run.case.same_update_rule:
        return
    model.train_on_batch(*tk.next_batch())
    assert int(model.optimizer.iterations.numpy()) == run.iterations + 1
    tolerance = {"rtol": TOLERANCE["rtol"], "atol": run.case.atol}
    assert_weights(model, run.weights_after, **tolerance)
    assert_state(model, run.state_after, **tolerance)


@pytest.mark.parametrize("case_name", list(tk.OPTIMIZERS))
def test_tfkeras_trial_optimizer_h5_alone(case_name, tmp_path_factory):
    """determined-keras-optimizer-weights.h5 by itself (weights loaded without the optimizer)."""
    run = trained(case_name, tmp_path_factory)
    folder = run.folders["tfkeras_trial"]
    h5_path = os.path.join(folder, "determined-keras-optimizer-weights.h5")
    model = keras3_model(run.case)
    result = load_determined_checkpoint(model, folder, load_optimizer=False)
    assert result.optimizer_variables_loaded == 0 and result.iterations is None
    assert int(model.optimizer.iterations.numpy()) == 0
    assert_weights(model, run.weights)

    loaded, iterations = load_h5_optimizer_file(model, h5_path)
    assert iterations == run.iterations
    assert loaded == sum(len(v) for v in run.state.values()) + 1 + len(run.case.scalars)
    assert_state(model, run.state)
    if run.case.scalars:
        _assert_rebuilt_u_product(model, run)
        return
    if not run.case.same_update_rule:
        return
    model.train_on_batch(*tk.next_batch())
    tolerance = {"rtol": TOLERANCE["rtol"], "atol": run.case.atol}
    assert_weights(model, run.weights_after, **tolerance)
    assert_state(model, run.state_after, **tolerance)


def _assert_rebuilt_u_product(model, run: Trained) -> None:
    """Nadam's ``_u_product`` is not in HDF5 files; the loader rebuilds it from iterations.

    The rebuilt value is the true schedule product (what Keras 3, and tf_keras run eagerly,
    hold: see test_nadam_u_product_matches_eager_tf_keras). tf_keras under tf.function counts
    it once per variable per step (its Python counter is frozen at trace time), so its stored
    value differs and one more step is not compared here; once u_product << 1 (after a few dozen
    steps) that difference no longer affects updates.
    """
    expected = nadam_u_product(0.9, run.iterations)
    np.testing.assert_allclose(np.asarray(model.optimizer._u_product), expected, rtol=1e-6)


def test_nadam_u_product_matches_eager_tf_keras():
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = tk.build_tf_keras_model(tf_keras.optimizers.Nadam(0.02))
    model.compile(optimizer=model.optimizer, loss="mse", run_eagerly=True)
    x, y = tk.data(0, batches=5)
    for step in range(5):
        batch = slice(step * tk.BATCH, (step + 1) * tk.BATCH)
        model.train_on_batch(x[batch], y[batch])
    got = np.asarray(model.optimizer._u_product)
    np.testing.assert_allclose(got, nadam_u_product(0.9, 5), rtol=1e-6)
    assert nadam_u_product(0.9, 0) == 1.0


def test_legacy_nadam_loads_with_a_warning_about_its_update_rule(tmp_path_factory, caplog):
    run = trained("legacy_nadam", tmp_path_factory)
    model = keras3_model(run.case)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        load_determined_checkpoint(model, run.folders["callback"])
    assert "legacy Nadam" in caplog.text and "decay" in caplog.text
    assert_state(model, run.state)


def test_new_and_legacy_h5_names_are_told_apart(tmp_path_factory):
    import h5py

    for case_name, new in (("adam", True), ("legacy_adam", False)):
        path = os.path.join(
            trained(case_name, tmp_path_factory).folders["tfkeras_trial"],
            "determined-keras-optimizer-weights.h5",
        )
        with h5py.File(path) as f:
            raw = f["optimizer-0/optimizer_weights"].attrs["weight_names"]
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in raw]
        assert is_new_layout_h5(names) is new, names


def test_batch_norm_model_non_trainable_weights_and_slots_line_up(tmp_path_factory):
    """Moving statistics are weights but not trainable: slots map to trainable variables only."""
    run = trained("adam", tmp_path_factory, batch_norm=True)
    for layout in LAYOUTS:
        model = keras3_model(run.case, batch_norm=True)
        load_determined_checkpoint(model, run.folders[layout])
        assert_weights(model, run.weights)
        assert_state(model, run.state)
        model.train_on_batch(*tk.next_batch())
        assert_weights(model, run.weights_after, **TOLERANCE)
        assert_state(model, run.state_after, **TOLERANCE)


def _untouched(model, before):
    for variable, value in zip(model.weights, before, strict=True):
        np.testing.assert_array_equal(np.asarray(variable), value)
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_adam_checkpoint_into_sgd_fails_and_changes_nothing(layout, tmp_path_factory):
    run = trained("adam", tmp_path_factory)
    model = keras3_model(tk.OPTIMIZERS["sgd_momentum"])
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(errors.ModelLoadError, match="SGD") as info:
        load_determined_checkpoint(model, run.folders[layout])
    assert "load_optimizer=False" in str(info.value)
    _untouched(model, before)
    # and weights alone load fine
    load_determined_checkpoint(model, run.folders[layout], load_optimizer=False)
    assert_weights(model, run.weights)


def test_amsgrad_mismatch_is_reported(tmp_path_factory):
    run = trained("adam_amsgrad", tmp_path_factory)
    model = keras3_model(tk.OPTIMIZERS["adam"])
    with pytest.raises(errors.ModelLoadError, match="amsgrad"):
        load_determined_checkpoint(model, run.folders["callback"])


def test_sgd_momentum_into_sgd_without_momentum_is_warned(tmp_path_factory, caplog):
    """The TF checkpoint does not say which momentum Keras 2 SGD had (its buffers exist either
    way), so the mismatch can only be warned about."""
    import keras

    run = trained("sgd_momentum", tmp_path_factory)
    model = tk.build_keras3_model(keras.optimizers.SGD(0.05))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = load_determined_checkpoint(model, run.folders["callback"])
    assert "momentum=0" in caplog.text and "ignored" in caplog.text
    assert result.iterations == run.iterations
    assert_weights(model, run.weights)


def test_keras2_sgd_without_momentum_loads_into_plain_sgd(tmp_path):
    """Keras 2 SGD builds (zero) momentums even with momentum=0; Keras 3 has none to fill."""
    import keras

    case = tk.OptimizerCase(
        "sgd",
        lambda tfk: tfk.optimizers.SGD(0.05),
        lambda lr: keras.optimizers.SGD(lr),
        0.05,
        False,
        (),
    )
    source = tk.train_tf_keras(case)
    folder = tk.save_callback_checkpoint(source, str(tmp_path / "ckpt"))
    model = tk.build_keras3_model(keras.optimizers.SGD(0.05))
    result = load_determined_checkpoint(model, folder)
    assert result.iterations == tk.TRAIN_STEPS
    source.train_on_batch(*tk.next_batch())
    model.train_on_batch(*tk.next_batch())
    assert_weights(model, [np.asarray(w) for w in source.weights], **TOLERANCE)


def test_learning_rate_schedule_keeps_schedule(tmp_path_factory, caplog):
    import keras

    run = trained("adam", tmp_path_factory)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=10, decay_rate=0.9)
    model = tk.build_keras3_model(keras.optimizers.Adam(schedule))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = load_determined_checkpoint(model, run.folders["callback"])
    assert result.learning_rate is None
    assert "schedule" in caplog.text
    assert_state(model, run.state)
    assert model.optimizer.learning_rate is not None


def test_uncompiled_model_gets_real_weights_only(tmp_path_factory, caplog):
    run = trained("adam", tmp_path_factory)
    model = tk.build_keras3_model(None)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = load_determined_checkpoint(model, run.folders["callback"])
    assert result.optimizer_variables_loaded == 0 and result.optimizer_layout is None
    assert "not compiled" in caplog.text
    assert_weights(model, run.weights)


def test_h5_model_hyperparameter_mismatch_is_warned(tmp_path_factory, caplog):
    import keras

    run = trained("adam", tmp_path_factory)
    model = tk.build_keras3_model(keras.optimizers.Adam(0.02, beta_1=0.5))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        load_determined_checkpoint(model, run.folders["tfkeras_h5"])
    assert "beta_1" in caplog.text


def test_imported_then_downloaded_checkpoints_continue_identically(tmp_path, tmp_path_factory):
    """`ckptstore import-determined` on real Keras 2 checkpoints, then download and load."""
    import json
    import shutil

    from tests.cli.helpers import make_env

    run = trained("adam", tmp_path_factory)
    source = tmp_path / "det"
    for layout, folder in run.folders.items():
        shutil.copytree(folder, source / layout)
    env = make_env(tmp_path)
    result = env.run("import-determined", str(source), "--trial", "9", "--json")
    assert result.exit_code == 0, result.output
    imported = {item["layout"]: item["uuid"] for item in json.loads(result.stdout)}
    assert set(imported) == set(LAYOUTS)
    listed = {r["uuid"] for r in env.json("checkpoint", "list", "--trial", "9")}
    assert listed == set(imported.values())
    for layout, uuid in imported.items():
        out = tmp_path / f"dl-{layout}"
        assert env.run("checkpoint", "download", uuid, "-o", str(out)).exit_code == 0
        model = keras3_model(run.case)
        result = load_determined_checkpoint(model, str(out))
        assert (result.layout, result.iterations) == (layout, run.iterations)
        model.train_on_batch(*tk.next_batch())
        assert_weights(model, run.weights_after, **TOLERANCE)
        assert_state(model, run.state_after, **TOLERANCE)


def test_unmapped_optimizer_fails_cleanly_and_weights_still_load(tmp_path):
    """Adafactor's factored Keras 2 state is not mapped: a clear error, nothing assigned."""
    import keras
    import tf_keras

    source = tk.build_tf_keras_model(tf_keras.optimizers.Adafactor(0.05))
    x, y = tk.data(0)
    source.train_on_batch(x[: tk.BATCH], y[: tk.BATCH])
    folder = tk.save_callback_checkpoint(source, str(tmp_path / "ckpt"))
    model = tk.build_keras3_model(keras.optimizers.Adafactor(0.05))
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(errors.ModelLoadError, match="Adafactor") as info:
        load_determined_checkpoint(model, folder)
    assert "load_optimizer=False" in str(info.value)
    _untouched(model, before)
    load_determined_checkpoint(model, folder, load_optimizer=False)
    assert_weights(model, [np.asarray(w) for w in source.weights])
