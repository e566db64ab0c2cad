"""The one-pass ``.keras`` writer: a standard zip Keras loads, with the right checksums."""

from __future__ import annotations

import io
import threading
import zipfile
import zlib

import google_crc32c
import h5py
import keras
import numpy as np
import pytest

from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import checksums as fast_crc
from ckptstore.keras_io.saving import _keras_archive as keras_archive
from ckptstore.keras_io.saving import _snapshot as snapshot_lib

pytestmark = pytest.mark.e2e  # trains Keras models end to end


def small_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((200,)),
            keras.layers.Dense(200),  # 160 KB kernel: written directly
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3),  # small arrays: written by h5py
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), loss="mse")
    x = np.random.default_rng(0).random((32, 200), dtype=np.float32)
    model.fit(x, x[:, :3], batch_size=8, verbose=0)
    return model


def check_archive(path: str, size: int, crc: str) -> None:
    data = open(path, "rb").read()
    assert size == len(data)
    assert crc == ckpt_checksums.crc32c_bytes(data) == ckpt_checksums.crc32c_file(path)
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every entry's CRC-32 is right
        assert zf.namelist()[:3] == ["model.weights.h5", "metadata.json", "config.json"]
        weights = zf.getinfo("model.weights.h5")
    # The weights' bytes sit where HDF5 looks for a superblock: h5py opens the archive itself
    # as the weights file (what a resume reads, without Keras's zip reader).
    assert data[keras_archive.WEIGHTS_DATA_OFFSET :][: weights.file_size] == zipfile.ZipFile(
        path
    ).read("model.weights.h5")
    with h5py.File(path, "r") as h5:
        assert h5.userblock_size == keras_archive.WEIGHTS_DATA_OFFSET


def assert_same_state(a: keras.Model, b: keras.Model) -> None:
    va = a.weights + a.optimizer.variables
    vb = b.weights + b.optimizer.variables
    assert len(va) == len(vb)
    for x, y in zip(va, vb, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.parametrize("zip64", [False, True])
def test_archive_loads_with_optimizer_and_checksums_match(tmp_path, monkeypatch, zip64):
    if zip64:  # exercise the zip64 records without writing gigabytes
        monkeypatch.setattr(keras_archive, "_ZIP64_LIMIT", 1000)
    model = small_model()
    snap = snapshot_lib.take_snapshot(snapshot_lib.StateLayout.of(model))
    path = str(tmp_path / "m.keras")
    size, crc = snapshot_lib.write_model_archive(snap, path)
    check_archive(path, size, crc)
    loaded = keras.models.load_model(path)
    assert_same_state(loaded, model)
    # same HDF5 tree as Keras's own file
    model.save(tmp_path / "ref.keras")
    assert _h5_tree(path) == _h5_tree(tmp_path / "ref.keras")


def test_the_layout_walk_primes_keras_skip_sets_and_writes_what_keras_does(tmp_path):
    """StateLayout.of computes Keras's skip sets once per type (a run without a checkpoint
    walks the model there first) and leaves them shared; the archive is still the one
    ``model.save`` writes on a thread whose cache is empty (Keras's state is per thread)."""
    from keras.src.saving import saving_lib

    model = small_model()

    def in_new_thread(fn):
        out = []
        thread = threading.Thread(target=lambda: out.append(fn()))
        thread.start()
        thread.join()
        return out[0]

    def ours():
        if saving_lib.get_attr_skipset("Layer") is saving_lib.get_attr_skipset("Layer"):
            return None  # this Keras finds its own cache
        layout = snapshot_lib.StateLayout.of(model)
        snapshot_lib.write_model_archive(
            snapshot_lib.take_snapshot(layout), str(tmp_path / "m.keras")
        )
        return [
            saving_lib.get_attr_skipset(kind) is saving_lib.get_attr_skipset(kind)
            for kind in ("Layer", "Sequential", "Optimizer")
        ]

    in_new_thread(lambda: model.save(tmp_path / "ref.keras"))
    cached = in_new_thread(ours)
    if cached is None:
        pytest.skip("this Keras finds its own cache")
    assert cached == [True, True, True]
    assert _h5_tree(tmp_path / "m.keras") == _h5_tree(tmp_path / "ref.keras")
    assert_same_state(keras.models.load_model(tmp_path / "m.keras"), model)


def _h5_tree(path):
    with zipfile.ZipFile(path) as z:
        h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
        items = []
        h5.visititems(lambda n, o: items.append((n, dict(o.attrs), getattr(o, "shape", None))))
        return items


def test_odd_dtypes_and_sizes_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {
        "f16": rng.random((300, 200)).astype(np.float16),
        "i64": rng.integers(-5, 5, (100, 100)),
        "u8": rng.integers(0, 255, 70_000, dtype=np.uint8),
        "bool": rng.random(70_000) > 0.5,
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "strided": rng.random((400, 400)).astype(np.float32)[:, ::2],
        "bf16": rng.random((300, 200)).astype("bfloat16"),
    }
    groups = [
        keras_archive.WeightGroup("layers/a/vars", {"name": "a"}, list(arrays.items())[:4]),
        keras_archive.WeightGroup("vars", None, list(arrays.items())[4:]),
    ]
    path = str(tmp_path / "x.keras")
    size, crc = keras_archive.write_archive(path, groups, config_json="{}")
    check_archive(path, size, crc)
    with zipfile.ZipFile(path) as z:
        h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
        assert dict(h5["layers/a/vars"].attrs) == {"name": "a"}
        for i, (key, array) in enumerate(arrays.items()):
            got = h5[f"{'layers/a/vars' if i < 4 else 'vars'}/{key}"][()]
            if key == "bf16":
                assert h5[f"vars/{key}"].attrs["dtype"] == "bfloat16"
                got = np.asarray(got).view(array.dtype) if got.dtype != array.dtype else got
            np.testing.assert_array_equal(got, array)


def test_assets_are_stored(tmp_path):
    asset = tmp_path / "vocab.txt"
    asset.write_bytes(b"a\nb\nc\n")
    groups = [keras_archive.WeightGroup("vars", None, [("0", np.ones(20_000, np.float32))])]
    path = str(tmp_path / "x.keras")
    size, crc = keras_archive.write_archive(
        path, groups, config_json="{}", assets=[("layers/t/vocab.txt", str(asset))]
    )
    check_archive(path, size, crc)
    with zipfile.ZipFile(path) as z:
        assert z.read("assets/layers/t/vocab.txt") == b"a\nb\nc\n"


@pytest.mark.parametrize("n1,n2", [(0, 0), (3, 0), (0, 9), (1000, 1), (70_001, 1 << 20)])
def test_crc_helpers_match_reference(n1, n2):
    rng = np.random.default_rng(n1 + n2)
    a = rng.integers(0, 256, n1, dtype=np.uint8)
    b = rng.integers(0, 256, n2, dtype=np.uint8)
    whole = a.tobytes() + b.tobytes()
    assert fast_crc.crc32c_update(0, a) == google_crc32c.value(a.tobytes())
    assert fast_crc.crc32c_update(fast_crc.crc32c_update(0, a), b) == google_crc32c.value(whole)
    assert fast_crc.crc32_update(fast_crc.crc32_update(0, a), b) == zlib.crc32(whole)
    c1, c2 = google_crc32c.value(a.tobytes()), google_crc32c.value(b.tobytes())
    assert fast_crc.crc32c_combine(c1, c2, n2) == google_crc32c.value(whole)
    z1, z2 = zlib.crc32(a.tobytes()), zlib.crc32(b.tobytes())
    assert fast_crc.crc32_combine(z1, z2, n2) == zlib.crc32(whole)


@pytest.mark.parametrize("poly", ["crc32c", "crc32"])
@pytest.mark.parametrize("n1,n2", [(1 << 28, 1 << 28), (3 << 28, 5 << 27), (1 << 32, 12345)])
def test_crc_combine_holds_for_pieces_of_512_mib_and_more(poly, n1, n2):
    """x^(8 (n1 + n2)) = x^(8 n1) x^(8 n2) modulo the polynomial: combining a piece of
    2^29 bytes or more used to take x^(2^32) for x (right for CRC-32's polynomial, wrong for
    CRC-32C's), so a model.keras whose weights reach 512 MiB got a wrong crc32c."""
    p = fast_crc._CRC32C_POLY if poly == "crc32c" else fast_crc._CRC32_POLY
    whole = fast_crc._x8nmodp(n1 + n2, p)
    assert whole == fast_crc._multmodp(fast_crc._x8nmodp(n1, p), fast_crc._x8nmodp(n2, p), p)
