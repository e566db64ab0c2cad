"""``mwms_compat`` in one process: it installs once, can be turned off, and leaves Keras's own
behaviour untouched outside multi-worker mode. The multi-worker behaviour itself is tested with
two real worker processes in ``test_multiworker.py``."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras.src.backend.tensorflow import trainer as tf_trainer

from ckptstore.keras_io.fit import _mwms_compat as mwms_compat

pytestmark = pytest.mark.e2e  # trains Keras models end to end


@pytest.fixture
def fresh(monkeypatch):
    """Undo the patch after the test (monkeypatch restores the Keras attributes)."""
    monkeypatch.setattr(tf_trainer, "reduce_per_replica", tf_trainer.reduce_per_replica)
    monkeypatch.setattr(
        tf_trainer.TensorFlowTrainer,
        "_maybe_symbolic_build",
        tf_trainer.TensorFlowTrainer._maybe_symbolic_build,
    )
    monkeypatch.setattr(mwms_compat, "_applied", False)
    monkeypatch.delenv(mwms_compat.ENV_DISABLE, raising=False)
    return monkeypatch


def test_applies_once(fresh):
    assert mwms_compat.apply_mwms_compat() is True
    reduce_fn = tf_trainer.reduce_per_replica
    build_fn = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    assert getattr(reduce_fn, mwms_compat._MARK) and getattr(build_fn, mwms_compat._MARK)
    fresh.setattr(mwms_compat, "_applied", False)  # even a second install does not re-wrap
    assert mwms_compat.apply_mwms_compat() is True
    assert tf_trainer.reduce_per_replica is reduce_fn
    assert tf_trainer.TensorFlowTrainer._maybe_symbolic_build is build_fn


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_env_turns_it_off(fresh, value):
    original = tf_trainer.reduce_per_replica
    fresh.setenv(mwms_compat.ENV_DISABLE, value)
    assert mwms_compat.apply_mwms_compat() is False
    assert tf_trainer.reduce_per_replica is original


def test_other_keras_major_is_left_alone(fresh):
    original = tf_trainer.reduce_per_replica
    fresh.setattr(keras, "__version__", "4.0.0")
    assert mwms_compat.apply_mwms_compat() is False
    assert tf_trainer.reduce_per_replica is original


def test_single_process_fit_unchanged(fresh):
    """Outside multi-worker mode the wrappers hand over to Keras: same weights and logs."""
    import tensorflow as tf

    x = np.random.RandomState(0).rand(32, 4).astype("float32")
    y = (x.sum(axis=1) * 1.5).astype("int64") % 3

    def train():
        with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        return history.history["loss"], [w.tolist() for w in model.get_weights()]

    before = train()
    assert mwms_compat.apply_mwms_compat() is True
    assert train() == before
