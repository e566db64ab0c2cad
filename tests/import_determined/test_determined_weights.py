"""load_determined_checkpoint: weights and optimizer state from Determined's Keras layouts."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.import_determined.weights import (
    load_determined_checkpoint,
    parse_optimizer_weight_name,
)
from tests.import_determined import determined_fixtures as fx


def _check_weights(model, values):
    for variable, expected in zip(model.weights, values["weights"], strict=True):
        np.testing.assert_array_equal(np.asarray(variable), expected)


def _check_adam(model, values, iterations):
    optimizer = model.optimizer
    assert int(optimizer.iterations.numpy()) == iterations
    for i in range(len(values["weights"])):
        np.testing.assert_array_equal(np.asarray(optimizer._momentums[i]), values["m"][i])
        np.testing.assert_array_equal(np.asarray(optimizer._velocities[i]), values["v"][i])


def test_callback_layout_loads_weights_and_adam_slots(tmp_path):
    values = fx.make_values(1)
    folder = fx.write_callback_checkpoint(str(tmp_path / "ckpt"), values, iterations=40)
    model = fx.build_keras_model()
    result = load_determined_checkpoint(model, folder, trust_pickle=True)
    assert result.layout == "callback"
    assert result.weights_loaded == 4
    assert result.optimizer_variables_loaded == 9  # 4 m + 4 v + iterations
    _check_weights(model, values)
    _check_adam(model, values, 40)
    assert (result.epoch, result.steps_completed, result.continue_id) == (3, 40, 11)
    # the loaded model trains on (the optimizer continues from the restored state)
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 41


def test_callback_state_pickle_not_read_without_trust(tmp_path, caplog):
    values = fx.make_values(2)
    folder = fx.write_callback_checkpoint(str(tmp_path / "ckpt"), values)
    model = fx.build_keras_model()
    with caplog.at_level(logging.WARNING):
        result = load_determined_checkpoint(model, folder)
    _check_weights(model, values)
    assert result.epoch is None and result.continue_id is None
    assert result.pickles_skipped == ["callback_state"]
    assert "--trust-pickle" in caplog.text and "callback_state" in caplog.text


def test_tfkeras_trial_layout_optimizer_from_h5(tmp_path):
    values = fx.make_values(3)
    marker = str(tmp_path / "pickle-was-read")
    folder = fx.write_tfkeras_trial_checkpoint(
        str(tmp_path / "ckpt"), values, iterations=100, marker=marker
    )
    model = fx.build_keras_model()
    result = load_determined_checkpoint(model, folder)
    assert result.layout == "tfkeras_trial"
    _check_weights(model, values)
    _check_adam(model, values, 100)
    assert result.steps_completed == 100
    assert sorted(result.pickles_skipped) == sorted(
        ["rng_state.pkl", "determined-callbacks.v1.pkl", "workload_sequencer.pkl"]
    )
    assert not os.path.exists(marker), "a pickle was unpickled without trust_pickle"
    load_determined_checkpoint(fx.build_keras_model(), folder, trust_pickle=True)
    assert os.path.exists(marker)  # proves the payload is live, so the check above means something


def test_old_h5_model_layout(tmp_path):
    values = fx.make_values(4)
    folder = fx.write_h5_model_checkpoint(str(tmp_path / "ckpt"), values, iterations=7)
    model = fx.build_keras_model()
    result = load_determined_checkpoint(model, folder)
    assert result.layout == "tfkeras_h5"
    _check_weights(model, values)
    _check_adam(model, values, 7)


def test_uncompiled_model_gets_weights_only(tmp_path):
    values = fx.make_values(5)
    folder = fx.write_callback_checkpoint(str(tmp_path / "ckpt"), values)
    model = fx.build_keras_model(optimizer=None)
    result = load_determined_checkpoint(model, folder)
    _check_weights(model, values)
    assert result.optimizer_variables_loaded == 0


def test_wrong_architecture_is_a_model_load_error(tmp_path):
    import keras

    folder = fx.write_callback_checkpoint(str(tmp_path / "ckpt"), fx.make_values(6))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    with pytest.raises(errors.ModelLoadError, match="shape"):
        load_determined_checkpoint(model, folder)
    small = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(errors.ModelLoadError, match="holds 4 weight"):
        load_determined_checkpoint(small, folder)


def test_sgd_model_rejects_adam_slots(tmp_path):
    folder = fx.write_callback_checkpoint(str(tmp_path / "ckpt"), fx.make_values(7))
    with pytest.raises(errors.ModelLoadError, match="optimizer it was trained with"):
        load_determined_checkpoint(fx.build_keras_model("sgd"), folder)


def test_not_a_determined_checkpoint(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(errors.InvalidCheckpoint, match="not a Determined checkpoint"):
        load_determined_checkpoint(fx.build_keras_model(), str(tmp_path))
    with pytest.raises(errors.ModelLoadError, match="not a folder"):
        load_determined_checkpoint(fx.build_keras_model(), str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Adam/iter:0", ("iter", None)),
        ("Adam/dense/kernel/m:0", ("m", "dense/kernel")),
        ("Adam/m/dense/kernel:0", ("m", "dense/kernel")),
        ("SGD/dense/bias/momentum:0", ("momentum", "dense/bias")),
        ("Adam/learning_rate:0", ("", None)),
    ],
)
def test_parse_optimizer_weight_name(name, expected):
    assert parse_optimizer_weight_name(name) == expected
