"""Checkpointing never fails a run that ``fit()`` would finish (issue 38): secondary artifacts
are best effort, weights-only checkpoints load into a model built in code
(``load_checkpoint_model(..., model=)``), and a model that cannot be checkpointed at all is one
typed error naming the layer.

Runs on the Keras ``tf.keras`` is: Keras 3 here, Keras 2 again in ``test_keras2_suite.py``. The
end-to-end shapes (a script's ``__main__`` classes, SIGTERM, resume) are in
``test_shape_corpus.py``.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from tests.checkpointing._helpers import stored_folder
from tests.keras_io.keras_under_test import keras, keras3_only, optimizer_variables

pytestmark = pytest.mark.e2e  # trains Keras models end to end

X = np.random.RandomState(0).rand(16, 4).astype("float32")
Y = (X.sum(axis=1) * 1.5).astype("int64") % 3


class Rescale(keras.layers.Layer):
    """Takes a Python iterable in ``__init__`` and has no ``get_config``: no config."""

    def __init__(self, source, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(next(iter(source)))
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x) * self.factor


class Holder(keras.layers.Layer):
    """Saves a generator as its own state: nothing can checkpoint it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.noise = (i for i in range(3))

    def call(self, x):
        return x

    def save_own_variables(self, store):
        store["noise"] = self.noise


def compiled(*layers, seed=4):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), *layers])
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def no_config_model():
    return compiled(Rescale(v for v in [0.5]))


def plain_model():
    return compiled(keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3))


@pytest.fixture
def train(tmp_path):
    """Train ``model`` 2 epochs with DeterminedCallback; the committed checkpoints' metadata."""

    def run(model, export="never"):
        with det.core.init(
            storage=str(tmp_path / "ckpts"),
            registry=f"sqlite:///{tmp_path / 'reg.db'}",
            trial_id=1,
            preempt_signals=False,
        ) as core:
            cb = det.keras.DeterminedCallback(core, None, 1, export_saved_model=export)
            model.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[cb])
            cb.wait()
            rows = core.registry.list_checkpoints(trial_id=1)
        metas = []
        for row in rows:
            folder = stored_folder(str(tmp_path / "ckpts"), row.uuid, tmp_path / row.uuid)
            with open(os.path.join(folder, "metadata.json")) as f:
                metas.append(json.load(f))
        return cb.last_checkpoint, metas

    return run


def load(tmp_path, uuid, **kwargs):
    return det.load_checkpoint_model(
        checkpoint_uuid=uuid,
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        **kwargs,
    )


def assert_same_state(a, b):
    for va, vb in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb))
    want, got = optimizer_variables(a), optimizer_variables(b)
    assert len(want) == len(got) > 1  # the optimizer state came with the weights
    for va, vb in zip(want, got, strict=True):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb))


def test_model_without_config_checkpoints_weights_only_and_loads_with_model_kwarg(
    train, tmp_path, caplog
):
    model = no_config_model()
    with caplog.at_level(logging.WARNING):
        uuid, metas = train(model)
    assert len(metas) == 2
    for meta in metas:  # every checkpoint says what it lacks, and why
        assert meta["full_model"] is False
        assert "model_config" in meta["missing"], meta
    warnings = [r for r in caplog.records if "saved without their full model" in r.message]
    assert len(warnings) == 1, [r.message for r in warnings]  # one per run, naming the fix
    assert "register_keras_serializable" in warnings[0].message
    assert "get_config" in warnings[0].message and "model=" in warnings[0].message
    with pytest.raises(errors.ModelLoadError, match="model="):
        load(tmp_path, uuid)
    loaded = load(tmp_path, uuid, model=no_config_model)  # a builder
    assert_same_state(model, loaded)
    np.testing.assert_array_equal(model.predict(X, verbose=0), loaded.predict(X, verbose=0))


def test_model_kwarg_loads_any_checkpoint_and_refuses_another_model(train, tmp_path):
    model = plain_model()
    uuid, _ = train(model)
    built = plain_model()
    assert load(tmp_path, uuid, model=built) is built  # a built model, returned
    assert_same_state(model, built)
    with pytest.raises(errors.ModelLoadError):
        load(tmp_path, uuid, model=compiled(keras.layers.Dense(7), keras.layers.Dense(3)))
    with pytest.raises(errors.ModelLoadError, match="model="):
        load(tmp_path, uuid, model="not a model")


@keras3_only("Keras 2 checkpoints are TensorFlow's object graph, not save_own_variables()")
def test_layer_saving_a_generator_is_one_typed_error_naming_it(train):
    model = compiled(keras.layers.Dense(3), Holder(name="holder"))
    with pytest.raises(errors.CheckpointError, match="'holder'") as info:
        train(model)
    assert "save_own_variables" in str(info.value)
