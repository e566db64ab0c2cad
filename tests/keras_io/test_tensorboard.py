"""ckptstore.keras.TensorBoard: Keras's event files land in <storage>/tensorboard/<trial id>/ (on the
Keras `tf.keras` is: Keras 3, and Keras 2 in `tests/keras_io/test_keras2_suite.py`)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ckptstore as det
from tests.keras_io.keras_under_test import keras

pytestmark = pytest.mark.e2e  # trains Keras models end to end


def test_tensorboard_logs_are_synced_to_storage(tmp_path):
    x = np.random.RandomState(0).rand(16, 3).astype("float32")
    with det.core.init(
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        trial_id=5,
        preempt_signals=False,
    ) as ctx:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", loss="mse")
        tb = det.keras.TensorBoard(ctx)
        local_dir = tb.log_dir
        model.fit(x, x[:, :1], epochs=2, validation_data=(x, x[:, :1]), verbose=0, callbacks=[tb])
        files = ctx.storage.list("tensorboard/5")
    events = [k for k in files if "tfevents" in k]
    assert any(k.startswith("train/") for k in events), files
    assert any(k.startswith("validation/") for k in events), files
    assert all(size > 0 for size in files.values())
    assert not os.path.exists(local_dir)  # the temporary local log dir is cleaned up


def test_tensorboard_keeps_a_given_log_dir(tmp_path):
    x = np.zeros((4, 2), dtype="float32")
    with det.core.init(
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        trial_id=6,
        preempt_signals=False,
    ) as ctx:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", loss="mse")
        tb = det.keras.TensorBoard(ctx, log_dir=str(tmp_path / "tb"))
        model.fit(x, x[:, :1], epochs=1, verbose=0, callbacks=[tb])
        assert ctx.storage.list("tensorboard/6")
    assert (tmp_path / "tb" / "train").is_dir()
