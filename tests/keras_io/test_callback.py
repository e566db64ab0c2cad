"""DeterminedCallback in one process: what a checkpoint holds, schedules, metrics, errors.

Runs on the Keras ``tf.keras`` is (``tests/keras_io/keras_under_test.py``): Keras 3 here, Keras 2
(tf_keras) again in ``tests/keras_io/test_keras2_suite.py``.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from tests.checkpointing._helpers import stored_folder
from tests.keras_io.keras_under_test import (
    KERAS_MAJOR,
    keras,
    keras3_only,
    optimizer_variables,
    tiny_model,
)

pytestmark = pytest.mark.e2e  # trains Keras models end to end


def classifier(optimizer: str = "adam"):
    """3 classes of 4 features, with Adam or SGD with momentum (different optimizer slots)."""
    return tiny_model(
        hidden=6,
        outputs=3,
        seed=3,
        optimizer=None if optimizer == "adam" else keras.optimizers.SGD(0.1, 0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["acc"],
    )


X = np.random.RandomState(0).rand(32, 4).astype("float32")
Y = (X.sum(axis=1) * 1.5).astype("int64") % 3


def fit(model, callbacks, epochs=2, **kw):
    return model.fit(
        X,
        Y,
        batch_size=8,
        epochs=epochs,
        shuffle=False,
        validation_data=(X, Y),
        verbose=0,
        callbacks=callbacks,
        **kw,
    )


@pytest.fixture
def init(tmp_path):
    def make(storage=None, trial_id=1):
        return det.core.init(
            storage=storage or str(tmp_path / "ckpts"),
            registry=f"sqlite:///{tmp_path / 'reg.db'}",
            trial_id=trial_id,
            preempt_signals=False,
        )

    return make


def committed(ctx) -> list:
    return ctx.registry.list_checkpoints(trial_id=ctx.trial_id)


# ---- arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"checkpoint_epochs": -1}, "checkpoint_epochs"),
        ({"checkpoint_epochs": 1.5}, "checkpoint_epochs"),
        ({"train_metrics_report_period": 0}, "train_metrics_report_period"),
        ({"train_metrics_report_period": "batch"}, "train_metrics_report_period"),
        ({"export_saved_model": "sometimes"}, "export_saved_model"),
        ({"preempt_check_period": -2}, "preempt_check_period"),
    ],
)
def test_bad_arguments_name_the_value(init, kwargs, needle):
    with init() as ctx:
        with pytest.raises(errors.InvalidConfig, match=needle) as info:
            det.keras.DeterminedCallback(ctx, None, 1, **kwargs)
        assert "Received" in str(info.value)


def test_continue_id_must_be_json(init):
    with init() as ctx, pytest.raises(errors.InvalidConfig, match="continue_id"):
        det.keras.DeterminedCallback(ctx, None, object())


# ---- what a checkpoint holds ------------------------------------------------------------------
def test_checkpoint_contents_and_schedule(init, tmp_path):
    with init() as ctx:
        model = classifier()
        cb = det.keras.DeterminedCallback(ctx, None, 1, checkpoint_epochs=2)
        fit(model, [cb], epochs=4)
        cb.wait()  # fit() does not wait for the final checkpoint's SavedModel export
        rows = committed(ctx)
        assert [r.steps_completed for r in rows] == [8, 16]  # epochs 2 and 4
        last = rows[-1]
        assert last.uuid == cb.last_checkpoint
        # The store's folder (deduplicated by default): the manifest, metadata and the
        # SavedModel whole in place; every file, assembled, in a download.
        in_store = set(os.listdir(tmp_path / "ckpts" / last.uuid))
        assert {"MANIFEST.json", "metadata.json", "saved_model"} <= in_store
        path = Path(stored_folder(str(tmp_path / "ckpts"), last.uuid, tmp_path / "last"))
        names = set(os.listdir(path))
        # Keras 3: a .keras archive; Keras 2: Determined's TF checkpoint + the model's config
        model_files = (
            {"model.keras"} if KERAS_MAJOR == 3 else {"model_checkpoint.index", "model_config.json"}
        )
        assert model_files | {"callback_state.json", "metadata.json"} <= names
        assert "saved_model" in names  # final checkpoint, export_saved_model="final"
        first = stored_folder(str(tmp_path / "ckpts"), rows[0].uuid, tmp_path / "first")
        assert "saved_model" not in os.listdir(first)
        meta = json.loads((path / "metadata.json").read_text())
        assert meta["continue_id"] == 1 and meta["steps_completed"] == 16 and meta["epoch"] == 4
        assert "val_loss" in meta["metrics"]
        state = json.loads((path / "callback_state.json").read_text())
        assert state["epoch"] == 4 and state["epoch_complete"] is True
        assert {"python", "numpy"} <= set(state["rng"])
        # the model files load with the full optimizer state (Keras 3: a normal .keras file;
        # Keras 2: Determined's model.load_weights(path / "model_checkpoint") into the model)
        if KERAS_MAJOR == 3:
            loaded = keras.models.load_model(path / "model.keras")
        else:
            loaded = classifier()
            loaded.load_weights(str(path / "model_checkpoint"))
            loaded.optimizer.build(loaded.trainable_variables)  # restores the deferred slots
        got = optimizer_variables(loaded)
        assert len(got) == len(optimizer_variables(model)) > 1
        for a, b in zip(optimizer_variables(model), got, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert int(loaded.optimizer.iterations.numpy()) == 16
        # metrics went to the registry
        val = ctx.registry.get_metrics(ctx.trial_id, "validation")
        assert [m.steps_completed for m in val] == [4, 8, 12, 16]


def test_checkpoint_epochs_zero_saves_only_at_end(init):
    with init() as ctx:
        cb = det.keras.DeterminedCallback(
            ctx, None, 1, checkpoint_epochs=0, export_saved_model="never"
        )
        fit(classifier(), [cb], epochs=3)
        assert [r.steps_completed for r in committed(ctx)] == [12]


def test_batch_metric_reporting(init):
    with init() as ctx:
        cb = det.keras.DeterminedCallback(
            ctx, None, 1, train_metrics_report_period=3, export_saved_model="never"
        )
        fit(classifier(), [cb], epochs=2)
        steps = [m.steps_completed for m in ctx.registry.get_metrics(ctx.trial_id, "training")]
        assert steps == [3, 6]


def test_steps_completed_counts_a_short_last_execution_as_it_is(init):
    """``compile(steps_per_execution=3)`` over 4 batches an epoch: executions of 3 and 1. Keras 3
    reports the short one as 3 batches; ``steps_completed`` counts the batches trained (also
    with ``steps_per_epoch``, where Keras 3 trains the last execution whole)."""
    with init() as ctx:
        model = classifier()
        model.compile(
            model.optimizer, model.loss, metrics=["acc"], steps_per_execution=3
        )  # the optimizer and loss classifier() compiled, in executions of 3
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=2)
        assert int(model.optimizer.iterations.numpy()) == 8  # 2 epochs of 4 batches
        assert cb.steps_completed == 8
        assert [r.steps_completed for r in committed(ctx)] == [4, 8]
        with ctx.checkpoint.restore_path(cb.last_checkpoint) as path:
            meta = json.loads((Path(path) / "metadata.json").read_text())
        assert meta["steps_completed"] == 8
        # with steps_per_epoch one iterator runs on: Keras 3 trains the last execution whole
        # (4 batches an epoch of 3 steps), Keras 2 shortens it (3); counted as trained
        import tensorflow as tf

        endless = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).repeat()
        model.compile(model.optimizer, model.loss, metrics=["acc"], steps_per_execution=2)
        before = cb.steps_completed, int(model.optimizer.iterations.numpy())
        model.fit(endless, epochs=2, steps_per_epoch=3, shuffle=False, verbose=0, callbacks=[cb])
        trained = int(model.optimizer.iterations.numpy()) - before[1]
        assert trained == (8 if KERAS_MAJOR == 3 else 6)
        assert cb.steps_completed - before[0] == trained


@keras3_only(
    "the .keras archive internals (model.weights.h5); Keras 2 checkpoints are TF checkpoints"
)
def test_snapshot_archive_matches_keras_layout_and_is_point_in_time(tmp_path):
    from ckptstore.keras_io.saving import _snapshot as snapshot_lib

    model = classifier()
    fit(model, [], epochs=1)
    layout = snapshot_lib.StateLayout.of(model)
    snap = snapshot_lib.take_snapshot(layout)
    expected = [v.numpy().copy() for v in model.weights + model.optimizer.variables]
    fit(model, [], epochs=1)  # changes every variable after the snapshot
    snapshot_lib.write_keras_archive(snap, str(tmp_path / "snap.keras"))
    model.save(tmp_path / "ref.keras")

    def tree(path):
        with zipfile.ZipFile(path) as z:
            h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
            items = []
            h5.visititems(lambda n, o: items.append((n, dict(o.attrs), getattr(o, "shape", None))))
            return items, sorted(z.namelist())

    assert tree(tmp_path / "snap.keras") == tree(tmp_path / "ref.keras")
    loaded = keras.models.load_model(tmp_path / "snap.keras")
    got = [v.numpy() for v in loaded.weights + loaded.optimizer.variables]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(loaded.optimizer.iterations.numpy()) == 4


# ---- resume errors ----------------------------------------------------------------------------
def test_resume_with_other_optimizer_is_an_error(init):
    with init() as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(classifier("adam"), [cb], epochs=1)
        uuid = cb.last_checkpoint
    with init() as ctx:
        cb = det.keras.DeterminedCallback(ctx, uuid, 1)
        with pytest.raises(errors.ResumeError, match="optimizer"):
            fit(classifier("sgd"), [cb], epochs=2)


def test_unknown_checkpoint_is_an_error(init):
    with init() as ctx:
        cb = det.keras.DeterminedCallback(ctx, "00000000-0000-0000-0000-000000000000", 1)
        with pytest.raises(errors.CheckpointNotFound):
            fit(classifier(), [cb], epochs=1)


def test_warm_start_loads_weights_only_and_protects(init):
    with init() as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        trained = classifier()
        fit(trained, [cb], epochs=2)
        uuid = cb.last_checkpoint
    with init(trial_id=2) as ctx:
        model = classifier()
        cb = det.keras.DeterminedCallback(ctx, uuid, continue_id=2, export_saved_model="never")
        seen = {}

        class Probe(keras.callbacks.Callback):
            """What the model holds after on_train_begin (the load), before its first step
            (Keras 2's fit() refuses epochs=0)."""

            def on_train_batch_begin(self, batch, logs=None):
                # self.model: on JAX, Keras syncs the trainer's state back into the variables
                seen.setdefault("weights", [w.numpy().copy() for w in self.model.weights])
                seen.setdefault("iterations", int(self.model.optimizer.iterations.numpy()))

        fit(model, [cb, Probe()], epochs=1)
        for a, b in zip(trained.weights, seen["weights"], strict=True):
            np.testing.assert_array_equal(a.numpy(), b)
        assert seen["iterations"] == 0
        assert cb.resumed is False
        assert uuid in ctx.checkpoint.protected


def test_a_resume_pins_its_checkpoint_once(init):
    """The checkpoint a run resumes from is pinned for the run (checkpoint GC anywhere keeps
    it) by one registry write: the restore's reads of it add no pin and unpin of their own
    (there were five pin writes before the first step: issue 41)."""
    import sqlalchemy as sa

    with init() as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(classifier(), [cb], epochs=1)
        uuid = cb.last_checkpoint
    with init() as ctx:
        statements: list[str] = []
        engine = ctx.registry._db.engine
        sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        cb = det.keras.DeterminedCallback(ctx, uuid, 1, export_saved_model="never")
        seen = {}

        class Probe(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if not seen:
                    seen["pins"] = [s for s in statements if "checkpoint_pins" in s]
                    seen["held"] = [p.holder for p in ctx.registry.list_pins(uuid)]

        fit(classifier(), [cb, Probe()], epochs=2)
        assert cb.resumed
        assert [s.split(" ")[0] for s in seen["pins"]] == ["DELETE", "INSERT"]  # expired, pin
        assert seen["held"] == [ctx.checkpoint.pin_holder]
        assert uuid in ctx.checkpoint.protected


# ---- background failures surface --------------------------------------------------------------
def test_failed_background_save_raises_from_fit(init, s3_server):
    # The bucket is there when core.init checks it (a missing one fails there: issue 39) and
    # gone when the first checkpoint uploads in the background.
    from tests.servers.emulators import create_bucket, s3_client

    create_bucket(s3_server, "ckptstore-vanishing-bucket")
    with pytest.raises(errors.BackgroundUploadError):
        with init(storage="s3://ckptstore-vanishing-bucket/x") as ctx:
            client = s3_client(s3_server)
            for item in client.list_objects_v2(Bucket="ckptstore-vanishing-bucket").get(
                "Contents", []
            ):
                client.delete_object(Bucket="ckptstore-vanishing-bucket", Key=item["Key"])
            client.delete_bucket(Bucket="ckptstore-vanishing-bucket")
            cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
            fit(classifier(), [cb], epochs=3)


# ---- stateful callbacks -----------------------------------------------------------------------
def test_stateful_callbacks_round_trip_json():
    stop = det.keras.EarlyStopping(monitor="val_loss", patience=3)
    plateau = det.keras.ReduceLROnPlateau(monitor="val_loss", patience=2)
    stop.on_train_begin()
    plateau.on_train_begin()
    stop.wait, stop.best, stop.best_epoch = 2, 0.25, 4
    plateau.wait, plateau.cooldown_counter, plateau.best = 1, 3, float("inf")
    s1 = json.loads(json.dumps(stop.get_state()))
    s2 = json.loads(json.dumps(plateau.get_state()))
    fresh_stop = det.keras.EarlyStopping(monitor="val_loss", patience=3)
    fresh_plateau = det.keras.ReduceLROnPlateau(monitor="val_loss", patience=2)
    fresh_stop.load_state(s1)
    fresh_plateau.load_state(s2)
    assert (fresh_stop.wait, fresh_stop.best, fresh_stop.best_epoch) == (2, 0.25, 4)
    assert (fresh_plateau.wait, fresh_plateau.cooldown_counter) == (1, 3)
    assert fresh_plateau.best == float("inf")


def test_callback_state_applied_after_on_train_begin(init):
    """Keras's EarlyStopping resets itself in on_train_begin; the restored state must win."""
    with init() as ctx:
        stop = det.keras.EarlyStopping(monitor="val_loss", patience=100, min_delta=1e-9)
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(classifier(), [cb, stop], epochs=2)
        saved = stop.get_state()
        uuid = cb.last_checkpoint
    with init() as ctx:
        stop2 = det.keras.EarlyStopping(monitor="val_loss", patience=100, min_delta=1e-9)
        seen = {}

        class Probe(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                seen.setdefault("state", stop2.get_state())

        cb = det.keras.DeterminedCallback(ctx, uuid, 1, export_saved_model="never")
        fit(classifier(), [cb, stop2, Probe()], epochs=3)
        assert seen["state"] == saved


def test_a_model_keras_builds_in_its_first_step_checkpoints_and_resumes(where):
    """A ``Sequential`` of layers without an ``Input`` (keras-io's transfer-learning scripts
    nest one such base): Keras 2 builds it in its first train step, after ``on_train_begin``,
    and ``DeterminedCallback`` failed the run there (``ValueError: Weights for model ... have
    not yet been created``). It is built from the fit()'s data first now; Keras 3 builds it
    before the callbacks start anyway. Resumed, the optimizer goes on from its 8 updates."""
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 4), dtype=np.float32), rng.random((32, 1), dtype=np.float32)

    def fit(checkpoint, epochs):
        keras.utils.set_random_seed(1)
        base = keras.Sequential([keras.layers.Dense(8, activation="relu")])
        model = keras.Sequential([base, keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        with det.core.init(**where.core_kwargs(), trial_id=1) as core:
            cb = det.keras.DeterminedCallback(core, checkpoint, 1, export_saved_model="never")
            model.fit(x, y, epochs=epochs, batch_size=8, verbose=0, callbacks=[cb])
            cb.wait()
        return model, cb

    first, cb = fit(None, 2)
    assert cb.steps_completed == 8 and cb.last_checkpoint
    second, cb = fit(cb.last_checkpoint, 3)
    assert cb.resumed and cb.steps_completed == 12
    assert int(second.optimizer.iterations.numpy()) == 12
    assert [w.shape for w in second.get_weights()] == [w.shape for w in first.get_weights()]
