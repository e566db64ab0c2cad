"""Deduplicated checkpoints (issue 19) written by DeterminedCallback: the frozen tensors of a
fine-tuned model are not stored again, and a reader still gets an ordinary ``model.keras`` that
plain ``keras.models.load_model`` opens (and that ``export_checkpoint`` can export)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptstore as det
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.keras_io.exporting import export_checkpoint
from ckptstore.keras_io.fit import _callback_state as state_lib

pytestmark = pytest.mark.e2e  # trains Keras models end to end

CHUNK = 16 * 1024
X = np.random.RandomState(2).rand(32, 256).astype("float32")
Y = np.random.RandomState(3).randint(0, 4, 32)


def fine_tuned_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    inputs = keras.Input((256,))
    x = inputs
    for i in range(3):  # a frozen "backbone" of 3 x 256 KiB
        layer = keras.layers.Dense(256, activation="relu", name=f"backbone_{i}")
        layer.trainable = False
        x = layer(x)
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(x))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(True))
    return model


def test_frozen_tensors_are_stored_once_and_model_keras_loads_with_plain_keras(tmp_path):
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    model = fine_tuned_model()
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        ctx.checkpoint.dedup = True
        ctx.checkpoint.dedup_chunk_bytes = CHUNK
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
        storage = ctx.checkpoint.storage
        first, second = (r.uuid for r in scan.sort_records(scan.scan_checkpoints(storage)))
    manifests = [fmt.read_manifest(storage, u) for u in (first, second)]
    assert [m["format_version"] for m in manifests] == [fmt.BLOBS_FORMAT_VERSION] * 2
    before = {c["sha256"] for c in manifests[0]["files"]["model.keras"]["blobs"]}
    chunks = manifests[1]["files"]["model.keras"]["blobs"]
    new = sum(c["size"] for c in chunks if c["sha256"] not in before)
    changed = sum(int(v.numpy().nbytes) for v in model.trainable_variables) + sum(
        int(v.numpy().nbytes) for v in model.optimizer.variables
    )
    # The frozen backbone keeps its offsets, so only the chunks around the head, the optimizer
    # state and the archive's headers are new: a small part of the file.
    assert new <= changed + 4 * CHUNK, (new, changed)
    assert new < manifests[1]["files"]["model.keras"]["size"] / 10

    with CheckpointContext(url) as reader:
        reader.download(second, str(tmp_path / "dl"))
    loaded = keras.models.load_model(str(tmp_path / "dl" / "model.keras"))  # plain Keras
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())

    # A SavedModel added later to a deduplicated checkpoint serves the same predictions.
    result = export_checkpoint(second, storage=url, registry=registry)
    assert result.verified
    with CheckpointContext(url) as reader:
        reader.download(second, str(tmp_path / "dl2"))  # verifies every file, blobs included
    served = tf.saved_model.load(os.path.join(tmp_path, "dl2", "saved_model"))
    np.testing.assert_allclose(
        served.serve(tf.constant(X)).numpy(), model.predict(X, verbose=0), rtol=1e-5, atol=1e-6
    )


def _dirtied() -> int | None:
    """Bytes of page cache this process dirtied so far (None where the kernel does not say)."""
    try:
        with open("/proc/self/io") as f:
            return int(dict(line.split(": ") for line in f.read().splitlines())["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


class ByteCounts:
    """Bytes a local store copied into new objects, chunks it linked in place, and bytes the
    writer wrote into the part files of ``model.keras``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from ckptstore.checkpointing import direct_writes
        from ckptstore.storage_backends import local

        self.copied = 0
        self.linked = 0
        self.parts = 0
        real_pwrite = direct_writes.PartWriter.pwrite

        def pwrite(part, data, offset):  # type: ignore[no-untyped-def]
            self.parts += memoryview(data).nbytes  # the writer thread alone writes parts
            return real_pwrite(part, data, offset)

        monkeypatch.setattr(direct_writes.PartWriter, "pwrite", pwrite)
        real_copy, real_link = local.copy_range, local.LocalStorage.link_if_absent
        lock = threading.Lock()

        def copy(src, dst, count, src_offset, dst_offset):  # type: ignore[no-untyped-def]
            done = real_copy(src, dst, count, src_offset, dst_offset)
            with lock:
                self.copied += done
            return done

        def link(storage, key, path, **kwargs):  # type: ignore[no-untyped-def]
            created = real_link(storage, key, path, **kwargs)
            size = os.path.getsize(path) if created else 0
            with lock:  # chunks are committed on several threads: no lost update
                self.linked += size
            return created

        monkeypatch.setattr(local, "copy_range", copy)
        monkeypatch.setattr(local.LocalStorage, "link_if_absent", link)


def test_with_default_settings_a_changed_head_costs_about_its_own_bytes(tmp_path, monkeypatch):
    """Chunks are cut at tensor boundaries (the writer hands the offsets to the commit), so with
    the default chunk size a checkpoint after a fine-tuning epoch uploads about the bytes of
    the tensors that changed (head, optimizer state), not the chunks around them. On a local
    store each new byte of ``model.keras`` is written once: the writer writes every chunk as
    its own file and the commit links the new ones into the blob folder (nothing copied), and
    the frozen kernels, unchanged since the last checkpoint, are taken from their blobs: not
    written, not hashed."""
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    keras.utils.set_random_seed(11)
    inputs = keras.Input((256,))
    x = inputs
    for i in range(4):  # a frozen backbone of 4 x 256 KiB kernels and 1 KiB biases
        layer = keras.layers.Dense(256, activation="relu", name=f"backbone_{i}")
        layer.trainable = False
        x = layer(x)
    model = keras.Model(inputs, keras.layers.Dense(64, name="head")(x))  # a 64 KiB kernel
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(True))
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        ctx.checkpoint.dedup = True  # default dedup_chunk_bytes (4 MiB)
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        counts, dirtied = ByteCounts(monkeypatch), _dirtied()
        frozen_kernel = model.get_layer("backbone_0").kernel

        def between(epoch, _logs):  # type: ignore[no-untyped-def]
            # Each checkpoint committed before the next is written: the frozen kernels' blobs
            # are then stored (a writer ahead of its commits writes them again, correctly).
            cb.wait()
            if epoch == 1:  # a frozen kernel changed by hand: the last checkpoint must have it
                frozen_kernel.assign(frozen_kernel.numpy() * 0.5)

        committed = keras.callbacks.LambdaCallback(on_epoch_end=between)
        model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[cb, committed])
        cb.wait()
        dirtied = None if dirtied is None else _dirtied() - dirtied  # type: ignore[operator]
        storage = ctx.checkpoint.storage
        uuids = [r.uuid for r in scan.sort_records(scan.scan_checkpoints(storage))]
    assert len(uuids) == 3
    blob_bytes = {
        c["sha256"]: c["size"]
        for u in uuids
        for e in fmt.read_manifest(storage, u)["files"].values()
        for c in e.get("blobs", ())
    }
    keras_new = sum(
        c["size"]
        for c in {
            c["sha256"]: c
            for u in uuids
            for c in fmt.read_manifest(storage, u)["files"]["model.keras"]["blobs"]
        }.values()
    )
    # Every new chunk of model.keras was linked; only the small files' chunks were copied.
    assert counts.linked >= keras_new > 0
    # The writer wrote the first archive whole, then the changed tensors and the headers only.
    first = fmt.read_manifest(storage, uuids[0])["files"]["model.keras"]["size"]
    frozen = sum(  # the kernels, each written straight from its buffer (not the biases)
        n for v in model.non_trainable_weights if (n := int(v.numpy().nbytes)) >= 64 * 1024
    )
    assert frozen > first / 2
    # (plus the kernel changed by hand, which is written again)
    bound = first + 2 * (first - frozen) + int(frozen_kernel.numpy().nbytes)
    assert first <= counts.parts <= bound, (counts.parts, first, frozen)
    assert counts.copied <= sum(blob_bytes.values()) - keras_new + 64 * 1024, counts.copied
    if dirtied:  # the kernel's count: the writer's files and the small files' copies, no more
        staged = sum(fmt.read_manifest(storage, u)["files"]["model.keras"]["size"] for u in uuids)
        others = sum(blob_bytes.values()) - keras_new
        assert dirtied < staged + 2 * others + keras_new / 2, (dirtied, staged, keras_new)
    changed = sum(int(v.numpy().nbytes) for v in model.trainable_variables) + sum(
        int(v.numpy().nbytes) for v in model.optimizer.variables
    )
    seen: set[str] = set()
    seen_state: set[str] = set()
    later_new = 0
    for i, uuid in enumerate(uuids):
        files = fmt.read_manifest(storage, uuid)["files"]
        # callback_state.json is cut around its parts: the RNG states, which training did
        # not draw from, are chunks already in storage; the epoch and steps are new.
        state = files["callback_state.json"]
        new_state = sum(c["size"] for c in state["blobs"] if c["sha256"] not in seen_state)
        seen_state.update(c["sha256"] for c in state["blobs"])
        if i:
            assert new_state < min(4096, state["size"] / 3), (new_state, state["size"])
        entry = files["model.keras"]
        new = sum(c["size"] for c in entry["blobs"] if c["sha256"] not in seen)
        seen.update(c["sha256"] for c in entry["blobs"])
        if i == 0:
            assert new == entry["size"]
            continue
        # Every trained tensor moved; the frozen ones (but the one changed by hand, in one of
        # these two), the config and HDF5's headers did not.
        by_hand = int(frozen_kernel.numpy().nbytes)
        assert 0.9 * changed <= new <= 1.1 * changed + by_hand, (new, changed)
        later_new += new
        assert len(entry["blobs"]) < 40  # tiny pieces are merged: requests stay few
    assert later_new >= 2 * 0.9 * changed + by_hand  # the kernel changed by hand is stored
    with CheckpointContext(url) as reader:
        reader.download(uuids[-1], str(tmp_path / "dl"))
    loaded = keras.models.load_model(str(tmp_path / "dl" / "model.keras"))  # plain Keras
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    for got, want in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    callbacks=st.dictionaries(st.text(), json_values, max_size=4),
    rng=st.dictionaries(st.text(), json_values, max_size=4),
    extra=st.dictionaries(st.one_of(st.text(), st.integers()), json_values, max_size=3),
)
def test_callback_state_cuts_keep_the_exact_json(callbacks, rng, extra):
    """The cut serialisation is byte for byte what json.dumps gives (readers read the same
    document); the cuts lie inside the file, in order, and frame each part."""
    state = state_lib.TrainingState(
        epoch=2, steps_completed=9, callbacks=callbacks, rng=rng, extra_variables=extra
    )
    text, cuts = state.to_json_with_cuts()
    assert text == json.dumps(dataclasses.asdict(state), default=state_lib._json_default)
    assert state.to_json() == text
    assert cuts == sorted(cuts) and all(0 < c < len(text) for c in cuts)
    for key, value in rng.items():  # each generator's state is a piece of its own
        piece = json.dumps(value)
        assert any(text[a:b] == piece for a, b in zip(cuts, cuts[1:], strict=False)), key


def test_callback_state_rng_parts_are_byte_identical_between_saves():
    rng = state_lib.capture_rng()
    one, cuts1 = state_lib.TrainingState(epoch=1, steps_completed=4, rng=rng).to_json_with_cuts()
    two, cuts2 = state_lib.TrainingState(
        epoch=12, steps_completed=40000, rng=state_lib.capture_rng()
    ).to_json_with_cuts()
    pieces1 = {one[a:b] for a, b in zip(cuts1, cuts1[1:], strict=False)}
    pieces2 = {two[a:b] for a, b in zip(cuts2, cuts2[1:], strict=False)}
    big = {p for p in pieces1 & pieces2 if len(p) > 4096}
    assert len(big) >= 2  # Python's and NumPy's generator states
    assert sum(map(len, big)) > 0.8 * len(two)


def test_signed_by_determined_callback_off_the_training_thread(tmp_path, monkeypatch):
    """A signing key signs every checkpoint DeterminedCallback commits (on the writer thread,
    over the logical files of a deduplicated checkpoint): the model loads with the verify key,
    and model_signing's own verifier accepts the downloaded folder."""
    import threading

    model_signing = pytest.importorskip("model_signing")
    from ckptstore.checkpointing import signing
    from tests.checkpointing._helpers import ec_key_pair

    key, pub = ec_key_pair(tmp_path)
    threads = []
    real = signing.sign_digests

    def record(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(signing, "sign_digests", record)
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    model = fine_tuned_model()
    with det.core.init(
        storage=url, registry=registry, trial_id=1, preempt_signals=False, signing_key=key
    ) as ctx:
        ctx.checkpoint.dedup = True
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        uuid = cb.last_checkpoint
    assert threads and threading.main_thread().name not in threads
    assert "blobs" in fmt.read_manifest(ctx.checkpoint.storage, uuid)["files"]["model.keras"]
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=url, registry=registry, verify_key=pub
    )
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    with CheckpointContext(url) as reader:
        reader.download(uuid, str(tmp_path / "dl"))
    folder = tmp_path / "dl"
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(
        folder, folder / signing.SIGNATURE_NAME
    )
