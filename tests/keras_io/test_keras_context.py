"""The new Keras API: keras.init(), wrap_data, wrap_optimizer, fit (resume), evaluate, predict,
load_checkpoint_model — on the Keras ``tf.keras`` is (Keras 3, and Keras 2 in
``tests/keras_io/test_keras2_suite.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ckptstore
from ckptstore import errors
from ckptstore.keras_io.context._context import shard_data
from ckptstore.registry import Registry
from tests.keras_io.keras_under_test import keras

pytestmark = pytest.mark.e2e  # trains Keras models end to end

X = np.linspace(-1, 1, 40, dtype="float32").reshape(20, 2)
Y = X @ np.array([[1.5], [-0.5]], dtype="float32")


@pytest.fixture
def places_in_env(tmp_path, monkeypatch):
    for name in ("TF_CONFIG", "CKPTSTORE_TRIAL_ID", "CKPTSTORE_HPARAMS", "CKPTSTORE_DATA_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPTSTORE_STORAGE", str(tmp_path / "ckpts"))
    monkeypatch.setenv("CKPTSTORE_REGISTRY", f"sqlite:///{tmp_path / 'reg.db'}")
    return tmp_path


def build(context):
    keras.utils.set_random_seed(1)
    with context.strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        opt = context.wrap_optimizer(keras.optimizers.Adam(context.training.hparams["lr"]))
        model.compile(optimizer=opt, loss="mse", metrics=["mae"])
    return model


def test_hparams_and_config_data_from_env(places_in_env, monkeypatch):
    monkeypatch.setenv("CKPTSTORE_HPARAMS", '{"lr": 0.05}')
    monkeypatch.setenv("CKPTSTORE_DATA_CONFIG", '{"batch_size": 4}')
    with ckptstore.keras.init() as context:
        assert context.training.hparams == {"lr": 0.05}
        assert context.config_data["batch_size"] == 4 and context.data is context.config_data
        assert context.distributed.size == 1 and context.distributed.shard_batch_size(8) == 8
        # a batch-inference style context created no trial
        assert Registry(str(places_in_env / "reg.db")).list_trials() == []
    with ckptstore.keras.init({"lr": 1}, config={"data": {"k": "v"}}) as context:
        assert context.training.hparams == {"lr": 1} and context.config_data == {"k": "v"}


def test_wrap_data_single_worker_is_unchanged(places_in_env):
    with ckptstore.keras.init({}) as context:
        x, y = context.wrap_data(X, Y)
        assert x is X and y is Y
        x, y, w = context.data.wrap(X, Y, np.ones(20))
        assert len(w) == 20
        ds = tf.data.Dataset.range(6)
        assert context.wrap_data(ds) is ds
        with pytest.raises(errors.InvalidConfig, match="19 rows but x has 20"):
            context.wrap_data(X, Y[:19])
        with pytest.raises(errors.InvalidConfig, match="keras.optimizers.Optimizer"):
            context.wrap_optimizer("adam")


def test_shard_data_kinds():
    xs = shard_data({"a": X, "b": [X, Y]}, rank=1, size=3)
    assert len(xs["a"]) == 6 and np.array_equal(xs["a"], X[1::3][:6])
    assert np.array_equal(xs["b"][1], Y[1::3][:6])
    ds = shard_data(tf.data.Dataset.range(10), rank=1, size=2)
    assert [int(v) for v in ds] == [1, 3, 5, 7, 9]

    # a keras.utils.PyDataset; Keras 2 has its predecessor, keras.utils.Sequence
    class Batches(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.full((2, 1), i), np.zeros((2, 1))

    seq = shard_data(Batches(), rank=0, size=2)
    assert len(seq) == 2 and [int(seq[i][0][0, 0]) for i in range(2)] == [0, 2]
    with pytest.raises(errors.InvalidConfig, match="Received: str"):
        shard_data("nope", 0, 2)


def test_fit_requires_validation(places_in_env):
    with ckptstore.keras.init({"lr": 0.01}, trial_id=1) as context:
        model = build(context)
        with pytest.raises(errors.InvalidConfig, match="validation"):
            context.fit(model, X, Y, epochs=1)


def test_fit_checkpoints_resumes_and_loads(places_in_env):
    with ckptstore.keras.init({"lr": 0.01}, trial_id=3) as context:
        model = build(context)
        hist = context.fit(
            model, X, Y, validation_data=(X, Y), epochs=2, batch_size=5, verbose=0, shuffle=False
        )
        assert len(hist.history["loss"]) == 2
        result = context.evaluate(model, X, Y, verbose=0, return_dict=True)
        assert set(result) >= {"loss", "mae"}
        preds = context.predict(model, X, verbose=0)
    with Registry(str(places_in_env / "reg.db")) as reg:
        first = reg.latest_checkpoint(3)
        assert first is not None
        assert reg.get_metrics(3, group="validation")

    # a re-run of the same trial resumes at epoch 2 and trains to 4
    with ckptstore.keras.init({"lr": 0.01}, trial_id=3) as context:
        model = build(context)
        hist = context.fit(
            model, X, Y, validation_data=(X, Y), epochs=4, batch_size=5, verbose=0, shuffle=False
        )
        # History's state is restored since exact resume (669b4fd): epochs 1-2 from the
        # checkpoint, 3-4 trained now; 16 optimizer steps in all prove 2 epochs were not redone.
        assert len(hist.history["loss"]) == 4
        assert int(model.optimizer.iterations.numpy()) == 16
        loaded = context.load_checkpoint_model(trial_id=3)
        np.testing.assert_allclose(
            loaded.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-5
        )
        assert not np.allclose(preds, model.predict(X, verbose=0))

    # a re-run of the finished trial trains no epoch and still returns the History it had
    with ckptstore.keras.init({"lr": 0.01}, trial_id=3) as context:
        model = build(context)
        again = context.fit(
            model, X, Y, validation_data=(X, Y), epochs=4, batch_size=5, verbose=0, shuffle=False
        )
        assert int(model.optimizer.iterations.numpy()) == 16
        assert again.epoch == [0, 1, 2, 3]
        assert again.history["loss"] == hist.history["loss"]
