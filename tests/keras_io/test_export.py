"""SavedModel exports (issue 20): built in a worker process from the checkpoint's own
``model.keras``, committed only once verified, for the checkpoints the policy picks; and added
later to a committed checkpoint with ``ckptstore checkpoint export`` / ``export_checkpoint``."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import ckptstore as det
from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.keras_io.exporting import ExportPolicy, export_checkpoint
from ckptstore.storage_backends import open_storage
from tests.checkpointing._helpers import stored_folder
from tests.cli.helpers import make_env
from tests.keras_io.export_common import (
    X,
    assert_committed_without_saved_model,
    fit,
    has_saved_model,
    init,
)
from tests.keras_io.keras_under_test import tiny_model

pytestmark = pytest.mark.e2e  # trains Keras models end to end


def serve(saved_model_dir: str, x: np.ndarray) -> np.ndarray:
    loaded = tf.saved_model.load(saved_model_dir)  # keep it alive: serve uses its variables
    return loaded.serve(tf.constant(x)).numpy()


class Score(keras.callbacks.Callback):
    """Puts a chosen metric into the epoch logs (before DeterminedCallback reads them)."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.values.pop(0)


def test_every_checkpoint_exported_in_a_worker_and_verified(tmp_path, monkeypatch):
    def no_export_here(self, *args, **kwargs):
        raise AssertionError("model.export() ran in the training process")

    monkeypatch.setattr(keras.Model, "export", no_export_here)
    with init(tmp_path) as ctx:
        model = tiny_model()
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="every")
        fit(model, [cb], epochs=2)
        last = cb.last_checkpoint  # waits for the commit
        rows = ctx.registry.list_checkpoints(trial_id=1)
        assert [r.steps_completed for r in rows] == [3, 6] and rows[-1].uuid == last
        for row in rows:
            assert has_saved_model(ctx.storage, row.uuid)
            assert row.metadata["saved_model"] is True
            assert "saved_model/saved_model.pb" in row.resources
        assert len(cb.save_blocked_seconds) == 2
        with CheckpointContext(ctx.storage) as reader:
            reader.download(last, str(tmp_path / "dl"))  # every file checks against the manifest
        predicted = serve(str(tmp_path / "dl" / "saved_model"), X)
        np.testing.assert_allclose(predicted, model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)


def test_default_exports_the_final_checkpoint_and_leaving_the_context_waits(tmp_path):
    with init(tmp_path) as ctx:
        model = tiny_model()
        cb = det.keras.DeterminedCallback(ctx, None, 1)  # export_saved_model="final"
        fit(model, [cb], epochs=2)
        storage_root = tmp_path / "ckpts"
    # no explicit wait: leaving the core context waited for the final checkpoint's export
    storage = open_storage(str(storage_root))
    committed = scan.sort_records(scan.scan_checkpoints(storage))
    assert [r.steps_completed for r in committed] == [3, 6]
    assert not has_saved_model(storage, committed[0].uuid)
    assert has_saved_model(storage, committed[1].uuid)
    folder = stored_folder(str(storage_root), committed[1].uuid, tmp_path / "final")
    predicted = serve(os.path.join(folder, "saved_model"), X)
    np.testing.assert_allclose(predicted, model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)
    # Each variable is stored once (Keras 3's own model.export() stores every one twice).
    stored = tf.train.load_checkpoint(os.path.join(folder, "saved_model", "variables", "variables"))
    shapes, dtypes = stored.get_variable_to_shape_map(), stored.get_variable_to_dtype_map()
    tensor_bytes = sum(
        int(np.prod(shapes[n])) * dtypes[n].size
        for n in shapes
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    )
    assert tensor_bytes == sum(int(v.numpy().nbytes) for v in model.weights)


def test_best_exports_improving_checkpoints_across_a_resume(tmp_path):
    policy = ExportPolicy("best", metric="score", smaller_is_better=True)
    with init(tmp_path) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model=policy)
        fit(tiny_model(), [Score([3.0, 1.0, 2.0]), cb], epochs=3)
        first = cb.last_checkpoint
    with init(tmp_path) as ctx:
        cb = det.keras.DeterminedCallback(ctx, first, 1, export_saved_model=policy)
        fit(tiny_model(), [Score([1.5, 0.5]), cb], epochs=5)  # resumes at epoch 3
        assert cb.resumed
        cb.wait()
        rows = ctx.registry.list_checkpoints(trial_id=1)
        exported = [r.steps_completed for r in rows if has_saved_model(ctx.storage, r.uuid)]
    # 3 -> export, 1 -> export, 2 no; after the resume the best is still 1: 1.5 no, 0.5 export
    assert [r.steps_completed for r in rows] == [3, 6, 9, 12, 15]
    assert exported == [3, 6, 15]
    assert rows[-1].metadata["saved_model_best"] == 0.5


def test_best_ranks_through_the_one_metric_rule():
    """'best' reads a checkpoint's metric as GC's best-N and best_checkpoint do: an infinite
    value (a diverged run) is no value, and Determined's nested form counts."""
    policy = ExportPolicy("best", metric="val_loss")
    assert not policy.wants(final=False, metrics={"val_loss": float("inf")})
    assert policy.best is None
    assert policy.wants(final=False, metrics={"validation_metrics": {"val_loss": 0.5}})
    assert not policy.wants(final=False, metrics={"val_loss": float("-inf")})
    assert not policy.wants(final=False, metrics={"val_loss": 0.7})
    assert policy.best == 0.5 and policy.metadata() == {"saved_model_best": 0.5}


@keras.saving.register_keras_serializable(package="ckptstore_test_export")
class Doubler(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


def test_a_failed_export_commits_the_checkpoint_without_it_and_warns_once(tmp_path, caplog):
    # A class registered only in this process (a different name than the module-level one):
    # the worker cannot load the model. The export is best effort (issue 38): every checkpoint
    # commits without saved_model/, its metadata says why, one warning names the fix.
    @keras.saving.register_keras_serializable(package="ckptstore_test_local")
    class LocalDoubler(keras.layers.Layer):
        def call(self, x):
            return x * 2.0

    model = keras.Sequential([keras.Input((4,)), LocalDoubler(), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.01), loss="mse")
    with init(tmp_path) as ctx:
        assert_committed_without_saved_model(
            ctx, model, caplog, "LocalDoubler", "register_keras_serializable"
        )


def test_cli_export_adds_a_verified_saved_model_to_an_existing_checkpoint(tmp_path):
    env = make_env(tmp_path)
    model = keras.Sequential([keras.Input((4,)), Doubler(), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.01), loss="mse")
    with det.core.init(
        storage=env.storage_url, registry=env.registry_url, trial_id=1, preempt_signals=False
    ) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
    assert not has_saved_model(open_storage(env.storage_url), uuid)

    refused = env.run("checkpoint", "export", uuid)  # Doubler's module: not on the config's word
    assert refused.exit_code == 5 and "--module tests.keras_io.test_export" in refused.output
    result = env.run(
        "checkpoint", "export", uuid, "--module", "tests.keras_io.test_export", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["verified"] and report["max_abs_diff"] < 1e-4
    assert env.run("checkpoint", "verify", uuid).exit_code == 0
    detail = env.json("checkpoint", "describe", uuid)
    assert "saved_model/saved_model.pb" in detail["resources"]
    predicted = serve(os.path.join(env.storage_url, uuid, "saved_model"), X)
    np.testing.assert_allclose(predicted, model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)

    again = env.run("checkpoint", "export", uuid, "--module", "tests.keras_io.test_export")
    assert again.exit_code != 0 and "already has a saved_model/" in again.output
    missing = env.run("checkpoint", "export", "00000000-0000-4000-8000-000000000000")
    assert missing.exit_code == 3, missing.output


def test_python_export_on_s3(tmp_path, storage_url_factory):
    url = storage_url_factory("s3")
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    model = tiny_model()
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
    with pytest.raises(errors.StorageNotAllowed):  # a row's URL alone does not choose storage
        export_checkpoint(uuid, registry=registry)
    result = export_checkpoint(uuid, registry=registry, storage=url)
    assert result.verified and result.path.endswith(f"{uuid}/saved_model")
    with CheckpointContext(url) as reader:
        reader.download(uuid, str(tmp_path / "dl"))
    predicted = serve(str(tmp_path / "dl" / "saved_model"), X)
    np.testing.assert_allclose(predicted, model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)


def test_exporting_a_signed_checkpoint_signs_it_again_or_is_refused(tmp_path, monkeypatch):
    """saved_model/ added to a signed checkpoint must be covered by its signature: without the
    signing key the export is refused; with another key too (the old signature must verify
    with the signer's own key); with the key the checkpoint verifies again, model_signing's
    verifier included."""
    model_signing = pytest.importorskip("model_signing")
    from ckptstore.checkpointing import signing
    from tests.checkpointing._helpers import ec_key_pair

    monkeypatch.delenv(signing.SIGNING_KEY_ENV, raising=False)
    monkeypatch.delenv(signing.VERIFY_KEY_ENV, raising=False)
    key, pub = ec_key_pair(tmp_path)
    other = ec_key_pair(tmp_path, "other")[0]
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    model = tiny_model()
    with det.core.init(
        storage=url, registry=registry, trial_id=1, preempt_signals=False, signing_key=key
    ) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        fit(model, [cb], epochs=1)
        uuid = cb.last_checkpoint
    before = fmt.read_manifest(open_storage(url), uuid)
    with pytest.raises(errors.InvalidConfig, match="--key KEY.pem"):
        export_checkpoint(uuid, registry=registry, storage=url)
    with pytest.raises(errors.SignatureError, match="does not verify"):
        export_checkpoint(uuid, registry=registry, storage=url, signing_key=other)
    assert fmt.read_manifest(open_storage(url), uuid) == before  # both left it as it was
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, key)  # the environment's key, as in the CLI
    assert export_checkpoint(uuid, registry=registry, storage=url).verified
    with CheckpointContext(url, verify_key=pub) as reader:
        reader.download(uuid, str(tmp_path / "dl"))
    folder = tmp_path / "dl"
    assert (folder / "saved_model" / "saved_model.pb").is_file()
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub)
    verifier.verify(folder, folder / signing.SIGNATURE_NAME)
