"""Resume and load read only what they need, the fast way (issue 41): the weights through
HDF5's own file driver (never Keras's zip reader), for DeterminedCallback, a TFKerasTrial and
load_checkpoint_model, the SavedModel never unless asked for.
Each test fails if the fast path is lost (no timings)."""

from __future__ import annotations

import os
import zipfile
from typing import Any

import keras
import numpy as np
import pytest

import ckptstore as det
from ckptstore.keras_io.exporting import export_checkpoint
from ckptstore.keras_io.saving import _weights_view as weights_view

pytestmark = pytest.mark.e2e  # trains Keras models end to end

X = np.random.RandomState(5).rand(32, 64).astype("float32")
Y = np.random.RandomState(6).randint(0, 3, 32)


def model_with_adam(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(300, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(True))
    return model


def state(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy() for v in model.weights + model.optimizer.variables]


class AdamTrial(det.keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(model_with_adam(1))
        model.compile(self.context.wrap_optimizer(keras.optimizers.Adam(0.01)), "mse")
        return model

    def build_training_data_loader(self):
        return X, np.eye(3, dtype="float32")[Y]

    def build_validation_data_loader(self):
        return X, np.eye(3, dtype="float32")[Y]


def run_trial(url: str, registry: str) -> Any:
    """Trial 2 for 4 batches (resumed from its checkpoint when it has one); its controller."""
    from ckptstore.keras_io.trial.controller import TrialController

    config = {
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 4}},
        "entrypoint": "test_fast_read:AdamTrial",
    }
    with det.core.init(
        storage=url, registry=registry, trial_id=2, hparams={"global_batch_size": 8}
    ) as ctx:
        controller = TrialController(AdamTrial, ctx, config)
        controller.run()
    return controller


@pytest.fixture
def zip_reads(monkeypatch):
    """Names of the members read through ``zipfile`` while the fixture is active."""
    opened: list[str] = []
    real = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(getattr(name, "filename", name))
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    return opened


@pytest.fixture
def assembled(monkeypatch):
    """Relative paths a download reassembled from their chunks while the fixture is active."""
    from ckptstore.checkpointing import blobs

    made: list[str] = []
    real = blobs.assemble

    def spy(storage, uuid, manifest, local_dir, select, **kwargs):  # type: ignore[no-untyped-def]
        made.extend(rel for rel, e in manifest.files.items() if blobs.is_chunked(e) and select(rel))
        return real(storage, uuid, manifest, local_dir, select, **kwargs)

    monkeypatch.setattr(blobs, "assemble", spy)
    return made


@pytest.mark.parametrize("dedup", [True, False])
def test_resume_and_load_read_weights_directly_and_never_the_saved_model(
    tmp_path, zip_reads, assembled, dedup
):
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    trained = model_with_adam(1)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        ctx.checkpoint.dedup = dedup
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        trained.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
        uuid = cb.last_checkpoint
    assert uuid is not None
    export_checkpoint(uuid, storage=url, registry=registry, verify=False)
    # A damaged SavedModel: whoever reads or checks it fails.
    saved = os.path.join(url, uuid, "saved_model", "saved_model.pb")
    with open(saved, "r+b") as f:
        f.write(b"not a SavedModel")
    zip_reads.clear()
    assembled.clear()  # the export read it whole

    resumed = model_with_adam(2)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, uuid, 1, export_saved_model="never")
        resumed.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert cb.resumed
    assert "model.weights.h5" not in zip_reads  # HDF5 read the archive itself
    # deduplicated: read in place from its chunk files, never reassembled into a copy
    assert "model.keras" not in assembled
    for got, want in zip(state(resumed), state(trained), strict=True):
        np.testing.assert_array_equal(got, want)  # nothing trained: 2 epochs were done

    zip_reads.clear()
    loaded = det.load_checkpoint_model(checkpoint_uuid=uuid, storage=url, registry=registry)
    assert "model.weights.h5" not in zip_reads  # HDF5 read them where they are
    assert "model.keras" not in assembled  # deduplicated: read in place, no reassembled copy
    for got, want in zip(state(loaded), state(trained), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), trained.predict(X, verbose=0))
    # the checkpoint's folder in its store, by path: deduplicated, read in place the same way
    # (a whole-file folder's archive is CRC-checked through zipfile: no manifest check there)
    by_path = det.keras.load_model_from_checkpoint_path(os.path.join(url, uuid))
    assert not dedup or "model.weights.h5" not in zip_reads
    assert "model.keras" not in assembled
    np.testing.assert_array_equal(by_path.predict(X, verbose=0), trained.predict(X, verbose=0))

    # A TFKerasTrial resumes through the same HDF5 read (trial 2 in the same storage).
    trial = run_trial(url, registry)
    zip_reads.clear()
    assembled.clear()
    resumed_trial = run_trial(url, registry)
    assert resumed_trial.batches_trained == 4 and resumed_trial.context.get_initial_batch() == 4
    assert "model.weights.h5" not in zip_reads
    assert "model.keras" not in assembled  # its chunks read in place (deduplicated by default)
    for got, want in zip(state(resumed_trial.model), state(trial.model), strict=True):
        np.testing.assert_array_equal(got, want)  # nothing trained: its 4 batches were done
    if dedup:
        resume_from_a_damaged_chunk(url, registry, uuid)


def resume_from_a_damaged_chunk(url: str, registry: str, uuid: str) -> None:
    """A chunk of the model.keras read in place, damaged at the same size: the resume and a
    load by UUID refuse it naming that blob, before any weight is loaded."""
    from ckptstore.checkpointing import blobs
    from ckptstore.checkpointing import format as fmt

    with open(os.path.join(url, uuid, fmt.MANIFEST_NAME), "rb") as f:
        manifest = fmt.Manifest.parse(f.read(), uuid)
    chunk = max(blobs.chunks_of(manifest.files["model.keras"]), key=lambda c: c.size)
    path = os.path.join(url, *blobs.blob_key(chunk.sha256).split("/"))
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(chunk.size // 2)
        byte = f.read(1)
        f.seek(chunk.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    fresh = model_with_adam(2)
    before = state(fresh)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, uuid, 1, export_saved_model="never")
        with pytest.raises(det.errors.ChecksumMismatch, match=chunk.sha256):
            fresh.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[cb])
    for got, want in zip(fresh.weights, before, strict=False):
        np.testing.assert_array_equal(got.numpy(), want)
    # a load by UUID reads the same chunks in place: refused the same way, before Keras
    with pytest.raises(det.errors.ChecksumMismatch, match=chunk.sha256):
        det.load_checkpoint_model(checkpoint_uuid=uuid, storage=url, registry=registry)


def test_weights_file_forms_of_every_archive(tmp_path):
    model = model_with_adam(3)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    keras_made = str(tmp_path / "keras.keras")
    model.save(keras_made)  # Keras's own layout: the weights after config.json, unaligned
    deflated = str(tmp_path / "deflated.keras")
    with zipfile.ZipFile(keras_made) as src, zipfile.ZipFile(deflated, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), zipfile.ZIP_DEFLATED)
    from ckptstore.keras_io.saving import _snapshot as snapshot_lib

    ours = str(tmp_path / "ours.keras")
    snap = snapshot_lib.take_snapshot(snapshot_lib.StateLayout.of(model))
    snapshot_lib.write_model_archive(snap, ours)
    for path, how in ((ours, "linked"), (keras_made, "extracted"), (deflated, "inflated")):
        fresh = model_with_adam(4)
        fresh.optimizer.build(fresh.trainable_variables)
        assert weights_view.load_weights(fresh, path) == how
        for got, want in zip(state(fresh), state(model), strict=True):
            np.testing.assert_array_equal(got, want)
    not_a_zip = tmp_path / "bad.keras"
    not_a_zip.write_bytes(b"PK\x03\x04 truncated")
    with weights_view.weights_file(str(not_a_zip)) as (path, how):
        assert (path, how) == (str(not_a_zip), None)  # Keras reports it in its own words


@pytest.mark.parametrize("decoy", [False, True])
def test_weights_at_an_aligned_offset_are_linked_unless_hdf5_would_stop_earlier(tmp_path, decoy):
    """HDF5 takes the first superblock signature at 0, 512, 1024, ...: weights at 1024 are read
    in place, unless a signature at 512 (inside a member before them) would be taken first."""
    model = model_with_adam(3)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    ref = str(tmp_path / "ref.keras")
    model.save(ref)
    odd = str(tmp_path / "odd.keras")
    pad = bytearray(1024 - 44 - 46)  # 44, 46: the two local headers before the weights' bytes
    if decoy:
        pad[512 - 44 : 512 - 44 + 8] = b"\x89HDF\r\n\x1a\n"
    with zipfile.ZipFile(ref) as src, zipfile.ZipFile(odd, "w") as dst:
        dst.writestr("assets/pad.bin", bytes(pad))
        dst.writestr("model.weights.h5", src.read("model.weights.h5"))
        for info in src.infolist():
            if info.filename != "model.weights.h5":
                dst.writestr(info.filename, src.read(info))
    with open(odd, "rb") as f:
        assert f.read(1032)[1024:] == b"\x89HDF\r\n\x1a\n"
    fresh = model_with_adam(4)
    fresh.optimizer.build(fresh.trainable_variables)
    assert weights_view.load_weights(fresh, odd) == ("extracted" if decoy else "linked")
    for got, want in zip(state(fresh), state(model), strict=True):
        np.testing.assert_array_equal(got, want)


def test_resumable_array_input_builds_its_pipeline_once_per_fit(tmp_path, monkeypatch):
    """DeterminedCallback's exact-resume input (arrays) traces its tf.data pipeline once per
    fit(), not every epoch (0.4 s of every epoch on a loaded 2-core machine)."""
    from ckptstore.keras_io.data import _resumable

    built: list[int] = []
    real = _resumable._ArrayData._build_dataset

    def counting(self):  # type: ignore[no-untyped-def]
        built.append(id(self))
        return real(self)

    monkeypatch.setattr(_resumable._ArrayData, "_build_dataset", counting)
    url, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    model = model_with_adam(1)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        history = model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[cb])
    assert len(history.history["loss"]) == 3
    assert len(built) == 1


def test_a_model_loads_from_every_form_of_archive(tmp_path):
    """load_archive builds the model from config.json and reads the weights itself for Keras's
    own archives and compressed ones; an archive with other entries (assets) goes through
    Keras's reader, whole or read in place: the same predictions every way."""
    from ckptstore.checkpointing.chunk_view import ChunkedFile
    from ckptstore.keras_io.loading._archive import load_archive

    model = model_with_adam(3)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    want = model.predict(X, verbose=0)
    keras_made = str(tmp_path / "keras.keras")
    model.save(keras_made)
    deflated, with_assets = str(tmp_path / "deflated.keras"), str(tmp_path / "assets.keras")
    with (
        zipfile.ZipFile(keras_made) as src,
        zipfile.ZipFile(deflated, "w") as dst,
        zipfile.ZipFile(with_assets, "w") as other,
    ):
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), zipfile.ZIP_DEFLATED)
            other.writestr(info.filename, src.read(info))
        other.writestr("assets/vocab.txt", "a\nb\n")
    options = {"compile": True, "custom_objects": None, "safe_mode": True}
    for path in (keras_made, deflated, with_assets):
        loaded = load_archive(path, **options)
        np.testing.assert_array_equal(loaded.predict(X, verbose=0), want)
        for got, saved in zip(state(loaded), state(model), strict=True):
            np.testing.assert_array_equal(got, saved)
        view = ChunkedFile(path, [path], [os.path.getsize(path)])  # one chunk: the file
        np.testing.assert_array_equal(load_archive(view, **options).predict(X, verbose=0), want)
