"""The public Keras API on whichever Keras ``tf.keras`` is: this module runs in the normal
(Keras 3) session and again under ``TF_USE_LEGACY_KERAS=1`` (Keras 2 / tf_keras) through
``tests/keras_io/test_keras2_suite.py``, on local storage and the S3 emulator.

Keras 2 runs use the optimizers Determined's users had: a legacy ``RMSprop`` with ``lr``/``decay``
and a Keras 2.11+ ``Adam``; Keras 3 runs use Keras 3's ``Adam`` and ``RMSprop``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from tests.keras_io.keras_under_test import (
    KERAS_MAJOR,
    keras,
    optimizer_variables,
)

pytestmark = pytest.mark.e2e  # trains Keras models end to end

BATCH, STEPS = 8, 4


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(3)
    x = rng.rand(BATCH * STEPS, 4).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")


#: Keras 3 has no legacy optimizers; the Keras 2 session covers them.
KINDS = ["new", "legacy"] if KERAS_MAJOR == 2 else ["new"]


def _optimizer(kind: str):
    if kind == "legacy":
        return keras.optimizers.legacy.RMSprop(lr=0.01, decay=1e-3)
    return keras.optimizers.Adam(0.01)


def _model(kind: str):
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(6, activation="relu"), keras.layers.Dense(1)]
    )
    if KERAS_MAJOR == 2:
        model.compile(_optimizer(kind), "mse", ["mae"])  # positional metrics, as Keras 2 code has
    else:
        model.compile(_optimizer(kind), "mse", metrics=["mae"])  # Keras 3: third is loss_weights
    return model


def _state(model) -> dict[str, np.ndarray]:
    # by position: Keras 2 names a second model's layers dense_2, dense_3, ...
    out = {f"w/{i}": v.numpy() for i, v in enumerate(model.weights)}
    out.update(
        {f"opt/{i}": np.asarray(v.numpy()) for i, v in enumerate(optimizer_variables(model))}
    )
    return out


class _Count(det.keras.callbacks.Callback):
    """Counts epochs across a resume (its state rides in callback_state.json)."""

    epochs = 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1

    def get_state(self):
        return {"epochs": self.epochs}

    def load_state(self, state):
        self.epochs = int(state["epochs"])


class _Ran(keras.callbacks.Callback):
    """Epochs run by this fit() (History may carry earlier runs' epochs over a resume)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def on_epoch_end(self, epoch, logs=None):
        self.count += 1


def _fit(ctx, model, epochs, checkpoint, continue_id=1, **kwargs):
    cb = det.keras.DeterminedCallback(ctx, checkpoint=checkpoint, continue_id=continue_id, **kwargs)
    counter, ran = _Count(), _Ran()
    x, y = _data()
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[cb, counter, ran],
    )
    return cb, counter, ran.count


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["file", "s3"])
def test_exact_resume_warm_start_and_load_by_uuid(tmp_path, storage_url_factory, where, kind):
    storage = storage_url_factory(where)
    registry = f"sqlite:///{tmp_path / 'registry.db'}"

    straight = _model(kind)
    x, y = _data()
    straight.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)

    with det.core.init(storage=storage, registry=registry, trial_id=1) as ctx:
        first, _, ran = _fit(ctx, _model(kind), 2, None, export_saved_model="never")
        assert ran == 2
        uuid = first.last_checkpoint
        meta = ctx.checkpoint.get_metadata(uuid)
        assert meta["keras_version"].split(".")[0] == str(KERAS_MAJOR)
        assert meta["framework"].startswith("tf_keras-" if KERAS_MAJOR == 2 else "keras-")
        with ctx.checkpoint.restore_path(uuid) as path:
            names = set(os.listdir(path))
            with open(os.path.join(path, "callback_state.json")) as f:
                state = json.load(f)
        expected = {"model_checkpoint.index"} if KERAS_MAJOR == 2 else {"model.keras"}
        assert expected | {"callback_state.json", "metadata.json"} <= names
        assert state["epoch"] == 2 and state["callbacks"]["_Count"] == {"epochs": 2}

        resumed_model = _model(kind)
        # no SavedModel here (an export worker is a fresh TensorFlow process): the warm start's
        # final checkpoint below has one
        second, counter, ran = _fit(ctx, resumed_model, 3, uuid, export_saved_model="never")
        assert second.resumed and ran == 1 and counter.epochs == 3
        assert second.steps_completed == 3 * STEPS
        want, got = _state(straight), _state(resumed_model)
        assert sorted(want) == sorted(got) and any(k.startswith("opt/") for k in got)
        for key in want:
            np.testing.assert_array_equal(want[key], got[key], err_msg=key)

        # warm start: another continue_id takes the weights only
        warm_model = _model(kind)
        warm, counter, ran = _fit(ctx, warm_model, 1, second.last_checkpoint, continue_id=2)
        assert not warm.resumed and ran == 1 and counter.epochs == 1
        assert int(keras.backend.get_value(warm_model.optimizer.iterations)) == STEPS
        final = warm.last_checkpoint

    # batch inference by UUID in this Keras, from the final checkpoint (with its SavedModel)
    loaded = det.load_checkpoint_model(checkpoint_uuid=final, storage=storage, registry=registry)
    np.testing.assert_allclose(
        np.asarray(loaded.predict(x, verbose=0)), warm_model.predict(x, verbose=0), rtol=1e-5
    )


def test_model_of_the_other_keras_is_refused(tmp_path):
    if KERAS_MAJOR == 2:
        import keras as other
    else:
        import tf_keras as other
    model = other.Sequential([other.Input((4,)), other.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with det.core.init(storage=str(tmp_path / "s"), registry=f"sqlite:///{tmp_path}/r.db") as ctx:
        cb = det.keras.DeterminedCallback(ctx, checkpoint=None, continue_id=1)
        with pytest.raises(errors.KerasMismatch, match="TF_USE_LEGACY_KERAS"):
            cb.set_model(model)
        with pytest.raises(errors.KerasMismatch):
            det.keras.TensorBoard(ctx).set_model(model)


def test_tensorboard_and_stateful_callbacks(tmp_path):
    storage = str(tmp_path / "store")
    with det.core.init(storage=storage, registry=f"sqlite:///{tmp_path}/r.db", trial_id=4) as ctx:
        model = _model("new")
        cb = det.keras.DeterminedCallback(
            ctx, checkpoint=None, continue_id=4, export_saved_model="never"
        )
        stop = det.keras.callbacks.EarlyStopping(monitor="loss", patience=5)
        plateau = det.keras.callbacks.ReduceLRScheduler(monitor="loss", patience=5)
        tb = det.keras.TensorBoard(ctx)
        x, y = _data()
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[cb, stop, plateau, tb])
        with ctx.checkpoint.restore_path(cb.last_checkpoint) as path:
            with open(os.path.join(path, "callback_state.json")) as f:
                saved = json.load(f)["callbacks"]
    assert {"EarlyStopping", "ReduceLROnPlateau"} <= set(saved)
    assert saved["EarlyStopping"]["best"] == pytest.approx(stop.best)
    events = list((tmp_path / "store" / "tensorboard" / "4").rglob("*.tfevents.*"))
    assert events, "TensorBoard logs were not synced to storage"


def test_load_model_from_checkpoint_path_and_keras3_migration(tmp_path):
    x, y = _data()
    with det.core.init(storage=str(tmp_path / "s"), registry=f"sqlite:///{tmp_path}/r.db") as ctx:
        model = _model("new")
        cb, _, _ = _fit(ctx, model, 1, None, export_saved_model="never")  # no SavedModel
        want = model.predict(x, verbose=0)
        with ctx.checkpoint.restore_path(cb.last_checkpoint) as path:
            loaded = det.keras.load_model_from_checkpoint_path(os.fspath(path))
            np.testing.assert_allclose(loaded.predict(x, verbose=0), want, rtol=1e-6)
            assert type(loaded).__module__.split(".")[0] == (
                "tf_keras" if KERAS_MAJOR == 2 else "keras"
            )
            if KERAS_MAJOR == 2:
                # the same Keras 2 checkpoint into a Keras 3 model: through import_determined
                import keras as keras3

                k3 = keras3.Sequential(
                    [
                        keras3.Input((4,)),
                        keras3.layers.Dense(6, activation="relu"),
                        keras3.layers.Dense(1),
                    ]
                )
                k3.compile(keras3.optimizers.Adam(0.01), "mse")
                det.keras.load_model_from_checkpoint_path(os.fspath(path), model=k3)
                np.testing.assert_allclose(k3.predict(x, verbose=0), want, rtol=1e-5)
                assert int(k3.optimizer.iterations.numpy()) == STEPS


def test_new_keras_api_wrap_optimizer_and_fit(tmp_path):
    x, y = _data()
    kind = KINDS[-1]  # Keras 2: a legacy optimizer
    with det.keras.init(
        hparams={"lr": 0.01},
        storage=str(tmp_path / "s"),
        registry=f"sqlite:///{tmp_path}/r.db",
        trial_id=3,
    ) as ctx:
        model = _model(kind)
        assert ctx.wrap_optimizer(model.optimizer) is model.optimizer
        with pytest.raises(errors.InvalidConfig):
            ctx.wrap_optimizer("adam")
        ctx.fit(model, x, y, validation_data=(x, y), epochs=2, batch_size=BATCH, verbose=0)
        assert int(keras.backend.get_value(model.optimizer.iterations)) == 2 * STEPS
        loaded = ctx.load_checkpoint_model(trial_id=3)
        np.testing.assert_allclose(
            np.asarray(loaded.predict(x, verbose=0)), model.predict(x, verbose=0), rtol=1e-5
        )
