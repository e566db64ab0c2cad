"""Tensor cuts for Keras 2 checkpoints: a deduplicated checkpoint of a Keras 2
``DeterminedCallback`` stores ``model_checkpoint.data-*`` (TensorFlow's format, weights and
optimizer) and the exported ``saved_model/variables/`` cut at their tensors, so the frozen 4 MiB
kernel of a fine-tuned model is stored once and the second checkpoint costs about its changed
tensors; ``TFKerasTrial`` checkpoints hand the same cuts to their commit. The index reader
itself is tested in ``test_tf_bundle.py``.

Keras 2 only: this module runs in the Keras 2 child of ``tests/keras_io/test_keras2_suite.py``.
"""

from __future__ import annotations

import os
from uuid import uuid4

import numpy as np
import tensorflow as tf

import ckptstore as det
from ckptstore.checkpointing import CheckpointContext, blobs, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _tf_bundle as tf_bundle
from tests.keras_io.keras_under_test import KERAS2_ONLY_MODULE, keras

pytestmark = KERAS2_ONLY_MODULE

#: As in test_tf_bundle.py: 64 KiB for the small files rewritten whole on every save (the
#: ``.index`` files with every tensor's crc32c, ``saved_model.pb``, ``keras_metadata.pb``,
#: ``fingerprint.pb``, ``checkpoint``) and the one merged chunk of a shard's tensors under
#: 4 KiB (biases, the optimizer's counters, the object graph). Only the shards are counted here.
ALLOWANCE = 64 * 1024
X = np.random.RandomState(4).rand(8, 64).astype("float32")
Y = np.zeros((8, 65536), "float32")


def fine_tuned_model():
    """A trainable 4 KiB head first, then a frozen backbone with a 4 MiB kernel: the head's
    tensors come first in the shards (``layer_with_weights-0`` sorts first), so a fixed 4 MiB
    chunk would hold the head and most of the frozen kernel."""
    keras.utils.set_random_seed(3)
    backbone = keras.layers.Dense(65536, name="backbone")
    backbone.trainable = False
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, name="head"), backbone])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def changed_bytes(first: str, second: str) -> int:
    """Bytes of the distinct tensor contents (crc32c, size) of the second bundle that the first
    does not hold."""
    before = {(e.crc32c, e.size) for e in tf_bundle.read_index(first)[1].values()}
    after = {(e.crc32c, e.size) for e in tf_bundle.read_index(second)[1].values() if e.size}
    return sum(size for _crc, size in after - before)


def new_bytes(manifests: list[dict], rel: str) -> int:
    """Bytes of the chunks of ``rel`` in the second manifest that the first did not store."""
    before = {c["sha256"] for c in manifests[0]["files"][rel]["blobs"]}
    chunks = {c["sha256"]: c["size"] for c in manifests[1]["files"][rel]["blobs"]}
    return sum(size for sha, size in chunks.items() if sha not in before)


def test_keras2_checkpoint_and_its_saved_model_cost_their_changed_tensors(tmp_path):
    # An in-process store without a local path (chunks everything, as S3 does): a local store
    # keeps saved_model/ whole (format.kept_whole_in_place).
    url = f"memory://tf-bundle-keras2-{uuid4().hex[:12]}/ckpts"
    model = fine_tuned_model()
    with det.core.init(
        storage=url,
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        trial_id=1,
        preempt_signals=False,
    ) as ctx:
        ctx.checkpoint.dedup = True
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="every")
        model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
        storage = ctx.checkpoint.storage
        uuids = [r.uuid for r in scan.sort_records(scan.scan_checkpoints(storage))]
    assert len(uuids) == 2
    dl = [str(tmp_path / f"dl{i}") for i in range(2)]
    with CheckpointContext(url) as reader:
        for uuid, path in zip(uuids, dl, strict=True):
            reader.download(uuid, path)  # reassembles every file, checking each chunk
        manifests = [fmt.read_manifest(reader.storage, u) for u in uuids]
    assert manifests[1]["format_version"] == fmt.BLOBS_FORMAT_VERSION

    prefix = keras2_format.WEIGHTS_PREFIX
    for index, shard in [
        (f"{prefix}.index", f"{prefix}.data-00000-of-00001"),
        (
            "saved_model/variables/variables.index",
            "saved_model/variables/variables.data-00000-of-00001",
        ),
    ]:
        changed = changed_bytes(*(os.path.join(p, index) for p in dl))
        new = new_bytes(manifests, shard)
        assert manifests[1]["files"][shard]["size"] > 4 * 2**20
        # The head (and, in the weights, its Adam slots and the counters): no frozen bytes.
        assert 0 < changed < 64 * 1024, (shard, changed)
        assert new <= 1.1 * changed + ALLOWANCE, (shard, new, changed)
        # Fixed offsets would have stored the first 4 MiB chunk again.
        assert new < blobs.DEFAULT_CHUNK_BYTES / 20, (shard, new)

    # What was restored is what was trained: the weights load, the SavedModel serves.
    restored = fine_tuned_model()
    restored.load_weights(os.path.join(dl[1], prefix)).expect_partial()
    want = model.predict(X, verbose=0)
    np.testing.assert_array_equal(restored.predict(X, verbose=0), want)
    loaded = tf.saved_model.load(os.path.join(dl[1], "saved_model"))
    signature = loaded.signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    (out,) = signature(**{name: tf.constant(X)}).values()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_tfkerastrial_hands_the_weights_cuts_to_its_commit(tmp_path, monkeypatch):
    """``TFKerasTrial`` checkpoints (``TrialController``, ``store_path`` directly) hand the
    commit the tensor cuts of ``model_checkpoint.data-*`` beside ``callback_state.json``'s."""
    from ckptstore.keras_io.trial.controller import TrialController
    from tests.keras_io.legacy_trial_model_def import LegacyOptTrial

    handed: list[dict[str, list[int]]] = []
    real = tf_bundle.add_folder_cuts

    def spy(folder, cuts):
        real(folder, cuts)
        handed.append({k: list(v) for k, v in (cuts or {}).items()})

    monkeypatch.setattr(tf_bundle, "add_folder_cuts", spy)
    config = {
        "hyperparameters": {"global_batch_size": 8, "lr": 0.01, "optimizer": "legacy"},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 4}},
        "min_validation_period": {"batches": 4},
        "scheduling_unit": 2,
        "entrypoint": "model_def:LegacyOptTrial",
    }
    with det.core.init(
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        trial_id=1,
        hparams={"global_batch_size": 8, "lr": 0.01, "optimizer": "legacy", "data": "arrays"},
        preempt_signals=False,
        checkpoint_dedup=True,
    ) as ctx:
        try:
            result = TrialController(LegacyOptTrial, ctx, config, trial_seed=7).run()
        finally:
            LegacyOptTrial.preempt = LegacyOptTrial.preempt_at = None
            LegacyOptTrial.last_counter = None
        assert result.latest_checkpoint
        manifest = fmt.read_manifest(ctx.checkpoint.storage, result.latest_checkpoint)
        with ctx.checkpoint.restore_path(result.latest_checkpoint) as path:
            want = tf_bundle.folder_cuts(os.fspath(path))
    shard = f"{keras2_format.WEIGHTS_PREFIX}.data-00000-of-00001"
    assert manifest["format_version"] == fmt.BLOBS_FORMAT_VERSION
    assert handed and set(want) == {shard} and len(want[shard]) > 4
    assert handed[-1][shard] == want[shard]  # the tensors' offsets, as the index lists them
    assert "callback_state.json" in handed[-1]  # the same dict as the controller's own cuts
