"""Keras 2 SavedModel exports (issues 14 and 20): built off the training process, in a Keras 2
worker (``TF_USE_LEGACY_KERAS=1``) from the checkpoint's own ``model_checkpoint.*`` +
``model_config.json``, committed only once verified; added later to a committed Keras 2
checkpoint with ``export_checkpoint`` / ``ckptstore checkpoint export``.

Keras 2 only: this module runs in the Keras 2 child of ``tests/keras_io/test_keras2_suite.py``
(the Keras 3 exports are ``tests/keras_io/test_export.py``'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ckptstore as det
from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.keras_io.exporting import export_checkpoint
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.storage_backends import open_storage
from tests.checkpointing._helpers import stored_folder
from tests.keras_io.export_common import (
    X,
    assert_committed_without_saved_model,
    fit,
    has_saved_model,
    init,
)
from tests.keras_io.keras_under_test import KERAS2_ONLY_MODULE, keras, tiny_model

pytestmark = KERAS2_ONLY_MODULE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Scale(keras.layers.Layer):
    """A custom layer in an importable module: the worker imports it from the config."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


class Unbuildable(keras.layers.Layer):
    """Its config cannot rebuild it (``get_config`` leaves out a required argument)."""

    def __init__(self, required, **kwargs):
        super().__init__(**kwargs)
        self.required = required

    def call(self, x):
        return x * self.required

    def get_config(self):
        return super().get_config()  # without ``required``: from_config fails


class Subclassed(keras.Model):
    """No config at all: no other process can rebuild it."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(5, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))


def keras2_model(extra=None, legacy=True):
    """The export tests' model with Keras 2's legacy RMSprop (with decay) or the new Adam."""
    optimizer = keras.optimizers.legacy.RMSprop(lr=0.01, decay=1e-3) if legacy else None
    return tiny_model(extra=extra, optimizer=optimizer, metrics=["mae"])


def serve(saved_model_dir: str, x: np.ndarray) -> np.ndarray:
    """What TF Serving calls: the ``serving_default`` signature Keras 2's ``model.save`` writes."""
    loaded = tf.saved_model.load(saved_model_dir)  # keep it alive: the signature uses it
    signature = loaded.signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    (out,) = signature(**{name: tf.constant(x)}).values()
    return out.numpy()


def assert_serves_like(saved_model_dir: str, model) -> None:
    want = model.predict(X, verbose=0)
    np.testing.assert_allclose(serve(saved_model_dir, X), want, rtol=1e-5, atol=1e-6)
    # and the SavedModel is still a Keras 2 one: tf.keras.models.load_model reads it back
    reloaded = keras.models.load_model(saved_model_dir, compile=False)
    np.testing.assert_allclose(reloaded.predict(X, verbose=0), want, rtol=1e-5, atol=1e-6)


@pytest.fixture
def no_training_thread_export(monkeypatch):
    """Any SavedModel written in this (the training) process fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the SavedModel was exported in the training process")

    monkeypatch.setattr(keras2_format, "export_saved_model", refuse)
    monkeypatch.setattr(keras.Model, "save", refuse)


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy_rmsprop", "adam"])
def test_every_checkpoint_exported_in_a_keras2_worker(tmp_path, no_training_thread_export, legacy):
    with init(tmp_path) as ctx:
        model = keras2_model(Scale(1.5), legacy=legacy)
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="every")
        fit(model, [cb], epochs=2)
        last = cb.last_checkpoint  # waits for the commit
        rows = ctx.registry.list_checkpoints(trial_id=1)
        assert [r.steps_completed for r in rows] == [3, 6] and rows[-1].uuid == last
        for row in rows:
            assert has_saved_model(ctx.storage, row.uuid)  # the manifest covers saved_model/
            assert row.metadata["saved_model"] is True
            assert row.metadata["framework"].startswith("tf_keras-2.")
        # fit() waited only for the snapshots
        assert len(cb.save_blocked_seconds) == 2 and max(cb.save_blocked_seconds) < 1.0
        with CheckpointContext(ctx.storage) as reader:
            reader.download(last, str(tmp_path / "dl"))  # every file checks against the manifest
    assert_serves_like(str(tmp_path / "dl" / "saved_model"), model)


def test_default_exports_only_the_final_checkpoint(tmp_path, no_training_thread_export):
    with init(tmp_path) as ctx:
        model = keras2_model()
        cb = det.keras.DeterminedCallback(ctx, None, 1)  # export_saved_model="final"
        fit(model, [cb], epochs=2)
    # leaving the core context waited for the final checkpoint's export
    storage = open_storage(str(tmp_path / "ckpts"))
    committed = scan.sort_records(scan.scan_checkpoints(storage))
    assert [r.steps_completed for r in committed] == [3, 6]
    assert not has_saved_model(storage, committed[0].uuid)
    assert has_saved_model(storage, committed[1].uuid)
    folder = stored_folder(str(tmp_path / "ckpts"), committed[1].uuid, tmp_path / "final")
    assert_serves_like(os.path.join(folder, "saved_model"), model)


def test_a_failed_worker_export_commits_without_it_and_warns_once(tmp_path, caplog):
    # best effort (issue 38): the checkpoints commit without saved_model/, metadata says why
    model = keras2_model(Unbuildable(3.0))
    with init(tmp_path) as ctx:
        assert_committed_without_saved_model(ctx, model, caplog, "could not rebuild", "get_config")


def test_adapted_lookups_round_trip_through_save_load_by_uuid_and_export(tmp_path):
    # issue 38 finding 2: Keras 2 left an adapted vocabulary out of model_config.json; a lookup
    # whose output size depends on it could not be rebuilt (export and load by UUID failed)
    words = np.array([["red"], ["green"], ["blue"], ["red"], ["cyan"], ["grey"]] * 4)
    ints = np.array([[3], [5], [7], [3], [9], [5]] * 4)
    texts = np.array(["the red cat", "a dog", "the cat and dog", "red end", "x y", "a b"] * 4)
    nums = np.random.RandomState(2).rand(24, 2).astype("float32")
    inputs = {
        "word": keras.Input((1,), dtype="string", name="word"),
        "num": keras.Input((1,), dtype="int64", name="num"),
        "text": keras.Input((), dtype="string", name="text"),
        "x": keras.Input((2,), name="x"),
    }
    data = {"word": words, "num": ints, "text": texts, "x": nums}
    branches = []
    for mode in ("int", "one_hot", "multi_hot", "count", "tf_idf"):
        lookup = keras.layers.StringLookup(output_mode=mode)
        lookup.adapt(words)
        branches.append(lookup(inputs["word"]))
    ilookup = keras.layers.IntegerLookup(output_mode="multi_hot")
    ilookup.adapt(ints)
    branches.append(ilookup(inputs["num"]))
    for mode, extra in (("int", {"output_sequence_length": 3}), ("tf_idf", {})):
        vectorize = keras.layers.TextVectorization(output_mode=mode, **extra)
        vectorize.adapt(texts)
        branches.append(vectorize(inputs["text"]))
    norm = keras.layers.Normalization()
    norm.adapt(nums)
    disc = keras.layers.Discretization(num_bins=3)
    disc.adapt(nums)
    hashing = keras.layers.Hashing(num_bins=4, output_mode="one_hot")
    branches += [norm(inputs["x"]), disc(inputs["x"]), hashing(inputs["word"])]
    merged = keras.layers.Concatenate()([tf.cast(b, "float32") for b in branches])
    model = keras.Model(inputs, keras.layers.Dense(2)(merged))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    y = np.random.RandomState(3).rand(24, 2).astype("float32")
    with init(tmp_path) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1)  # the final checkpoint exports
        model.fit(data, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        uuid = cb.last_checkpoint
        assert has_saved_model(ctx.storage, uuid)
        assert ctx.registry.get_checkpoint(uuid).metadata.get("missing") is None
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid,
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
    )
    np.testing.assert_array_equal(loaded.predict(data, verbose=0), model.predict(data, verbose=0))


def test_a_model_no_process_can_rebuild_exports_on_the_training_thread(tmp_path, caplog):
    # documented fallback: a subclassed model (no config) is exported where it lives
    with init(tmp_path) as ctx:
        model = Subclassed()
        model(X[:1])  # built before fit(): the callback builds the optimizer at fit start
        model.compile(keras.optimizers.Adam(0.01), "mse")
        cb = det.keras.DeterminedCallback(ctx, None, 1)
        with caplog.at_level("WARNING", logger="ckptstore.keras_io.fit._callback"):
            fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
        assert has_saved_model(ctx.storage, uuid)
    assert "training thread" in caplog.text and "subclassed" in caplog.text
    np.testing.assert_allclose(
        tf.saved_model.load(
            os.path.join(
                stored_folder(str(tmp_path / "ckpts"), uuid, tmp_path / "dl"), "saved_model"
            )
        )(tf.constant(X)),
        model.predict(X, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_export_checkpoint_adds_a_saved_model_to_a_keras2_checkpoint(tmp_path, storage_url_factory):
    url = storage_url_factory("s3")
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    model = keras2_model(Scale(0.5))
    with init(tmp_path, storage=url) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
        assert not has_saved_model(ctx.storage, uuid)

    with pytest.raises(errors.StorageNotAllowed):  # a row's URL alone does not choose storage
        export_checkpoint(uuid, registry=registry)
    # This Keras 2 process already imported Scale's module, so using the class imports nothing:
    # no modules= needed (a process that has not imported it is refused: test_code_refs_imported)
    result = export_checkpoint(uuid, registry=registry, storage=url)
    assert result.verified and result.max_abs_diff < 1e-4
    assert result.path.endswith(f"{uuid}/saved_model")
    with CheckpointContext(url) as reader:
        reader.download(uuid, str(tmp_path / "dl"))  # the amended manifest covers saved_model/
    assert_serves_like(str(tmp_path / "dl" / "saved_model"), model)
    with pytest.raises(errors.CheckpointConflict, match="already has a saved_model/"):
        export_checkpoint(uuid, registry=registry, storage=url, modules=[Scale.__module__])


def test_cli_export_of_a_keras2_checkpoint_from_a_keras3_process(tmp_path):
    """``python -m ckptstore.keras_io.exporting checkpoint UUID`` (what ``ckptstore checkpoint
    export`` runs) without TF_USE_LEGACY_KERAS: it hands the Keras 2 checkpoint to a Keras 2
    worker; a subclassed model's checkpoint gets a typed error."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    model = keras2_model(Scale(2.0))
    with init(tmp_path) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
        sub = Subclassed()
        sub(X[:1])
        sub.compile(keras.optimizers.Adam(0.01), "mse")
        cb2 = det.keras.DeterminedCallback(ctx, None, 2, export_saved_model="never")
        fit(sub, [cb2], epochs=1)
        sub_uuid = cb2.last_checkpoint
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["PYTHONPATH"] = REPO

    def run(checkpoint):
        command = [sys.executable, "-m", "ckptstore.keras_io.exporting", "checkpoint", checkpoint]
        proc = subprocess.run(
            # the caller's storage, as `ckptstore checkpoint export` passes it
            [*command, "--registry", registry, "--storage", str(tmp_path / "ckpts")]
            + ["--module", Scale.__module__],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.stdout.strip(), proc.stderr[-3000:]
        return proc, json.loads(proc.stdout.strip().splitlines()[-1])

    proc, report = run(uuid)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verified"] and report["max_abs_diff"] < 1e-4, report
    folder = stored_folder(str(tmp_path / "ckpts"), uuid, tmp_path / "exported")
    assert_serves_like(os.path.join(folder, "saved_model"), model)
    with CheckpointContext(str(tmp_path / "ckpts")) as reader:
        reader.download(uuid, str(tmp_path / "dl"))  # verifies every file, saved_model/ too

    proc, report = run(sub_uuid)
    assert proc.returncode == 1 and report["error"] == "ModelLoadError", report
    assert "subclassed" in report["message"]
