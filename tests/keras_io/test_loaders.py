"""Loaders: every path of load_model_from_checkpoint_path / load_checkpoint_model, each error,
and examples/batch_inference.py end to end (local files + SQLite, and S3).

On the Keras ``tf.keras`` is: Keras 3, and Keras 2 in ``tests/keras_io/test_keras2_suite.py``,
where the checkpoints are in DeterminedCallback's Keras 2 layout (``model_checkpoint.*`` +
``model_config.json``, ``saved_model/`` from ``model.save(save_format="tf")``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import ckptstore
import ckptstore.keras
from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.row_storage import ALLOWED_STORAGE_ENV
from ckptstore.core import init
from ckptstore.keras_io.loading import load_model_from_folder
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.checkpointing._helpers import corrupt_stored, ec_key_pair, forge, write_manifest
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras, keras3_only, tiny_model

pytestmark = pytest.mark.e2e  # trains Keras models end to end

REPO = Path(__file__).resolve().parents[2]
X = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)


#: The file a checkpoint's weights are in (corrupted by the checksum test).
WEIGHTS_FILE = "model.keras" if KERAS_MAJOR == 3 else "model_checkpoint.data-00000-of-00001"


def linear_model(seed: int = 0):
    """One Dense layer over 3 features; each seed gives other weights."""
    return tiny_model(inputs=3, hidden=0, seed=seed, optimizer="adam")


def save_checkpoint(storage, registry, trial_id, model, steps, val_loss=None, files=("keras",)):
    """Write a checkpoint the way DeterminedCallback lays it out; returns its UUID."""
    metadata = {"steps_completed": steps}
    if val_loss is not None:
        metadata["metrics"] = {"val_loss": val_loss}
    with init(storage=storage, registry=registry, trial_id=trial_id, preempt_signals=False) as ctx:
        with ctx.checkpoint.store_path(metadata) as (path, uuid):
            if "keras" in files and KERAS_MAJOR == 3:
                model.save(os.path.join(path, "model.keras"))
            elif "keras" in files:  # Keras 2: Determined's TF checkpoint + the model's config
                model.save_weights(os.path.join(path, "model_checkpoint"))
                Path(path, "model_config.json").write_text(model.to_json())
            if "saved_model" in files:
                export(model, os.path.join(path, "saved_model"))
            if not files:
                Path(path, "notes.txt").write_text("no model here")
    return uuid


def export(model, path: str) -> None:
    """The inference SavedModel DeterminedCallback writes on this Keras."""
    if KERAS_MAJOR == 3:
        model.export(path, verbose=False)
    else:
        model.save(path, save_format="tf")


@pytest.fixture
def where_allowed(where, monkeypatch):
    """:func:`where`, its storage allowed: loads without storage= read the URL a registry row
    recorded only when it is allowed."""
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, where.storage)
    return where


def test_latest_best_and_uuid(where_allowed):
    storage, registry = where_allowed
    models = [linear_model(seed) for seed in range(3)]
    uuids = [
        save_checkpoint(storage, registry, 5, m, steps=10 * (i + 1), val_loss=loss)
        for i, (m, loss) in enumerate(zip(models, [0.5, 0.1, 0.3], strict=True))
    ]
    expected = [m.predict(X, verbose=0) for m in models]

    latest = ckptstore.load_checkpoint_model(trial_id=5, storage=storage, registry=registry)
    np.testing.assert_allclose(latest.predict(X, verbose=0), expected[2], rtol=1e-6)
    if KERAS_MAJOR == 3:  # Keras 2 rebuilds the model from model_config.json: not compiled
        assert latest.optimizer is not None and latest.optimizer.built

    best = ckptstore.load_checkpoint_model(
        trial_id=5, storage=storage, registry=registry, best_by="val_loss"
    )
    np.testing.assert_allclose(best.predict(X, verbose=0), expected[1], rtol=1e-6)
    worst = ckptstore.load_checkpoint_model(
        trial_id=5, registry=registry, best_by="val_loss", smaller_is_better=False
    )  # storage comes from the URL the registry recorded (allowed by the fixture)
    np.testing.assert_allclose(worst.predict(X, verbose=0), expected[0], rtol=1e-6)

    by_uuid = ckptstore.load_checkpoint_model(
        checkpoint_uuid=uuids[0], storage=storage, registry=registry, compile=False
    )
    np.testing.assert_allclose(by_uuid.predict(X, verbose=0), expected[0], rtol=1e-6)


def test_loading_again_from_s3_takes_the_bytes_from_the_restore_cache(
    storage_url_factory, tmp_path, caplog
):
    storage, registry = storage_url_factory("s3"), f"sqlite:///{tmp_path / 'r.db'}"
    model = linear_model(7)
    uuid = save_checkpoint(storage, registry, 1, model, steps=1)
    fetched = []
    for cache in (None, None, False):  # the default (on for S3), again, then opted out
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="ckptstore.checkpointing.restore"):
            loaded = ckptstore.load_checkpoint_model(
                checkpoint_uuid=uuid, storage=storage, registry=registry, cache=cache
            )
        np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
        found = re.search(r"(\d+) bytes from storage .*, (\d+) from the restore cache", caplog.text)
        assert found is not None, caplog.text
        fetched.append((int(found[1]), int(found[2])))
    (first, cached), (again, hit), (opted_out, none) = fetched
    assert first > 0 and cached == 0
    assert again == 0 and hit == first
    assert opted_out == first and none == 0


def test_a_row_naming_another_storage_is_loaded_only_when_allowed(where_allowed, monkeypatch):
    """Issue 27, finding 2: a registry row does not choose where a model is loaded from."""
    storage, registry = where_allowed
    model = linear_model()
    uuid = save_checkpoint(storage, registry, 12, model, steps=1)
    monkeypatch.delenv(ALLOWED_STORAGE_ENV)
    for call in (
        lambda: ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry),
        lambda: ckptstore.load_checkpoint_model(trial_id=12, registry=registry),
    ):
        with pytest.raises(errors.StorageNotAllowed, match=ALLOWED_STORAGE_ENV):
            call()
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, f"gs://elsewhere, {storage}")
    loaded = ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    monkeypatch.delenv(ALLOWED_STORAGE_ENV)
    monkeypatch.setenv("CKPTSTORE_STORAGE", storage)  # the storage the caller opened
    loaded = ckptstore.load_checkpoint_model(trial_id=12, registry=registry)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))


def test_storage_scan_when_the_registry_does_not_know(where_allowed, tmp_path):
    storage, registry = where_allowed
    model = linear_model()
    uuid = save_checkpoint(storage, registry, 9, model, steps=3, val_loss=0.2)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    by_trial = ckptstore.load_checkpoint_model(trial_id=9, storage=storage, registry=empty)
    by_best = ckptstore.load_checkpoint_model(
        trial_id=9, storage=storage, registry=empty, best_by="val_loss"
    )
    by_uuid = ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=empty)
    for loaded in (by_trial, by_best, by_uuid):
        np.testing.assert_allclose(
            loaded.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-6
        )


def test_saved_model_fallback(where_allowed, tmp_path):
    storage, registry = where_allowed
    model = linear_model()
    uuid = save_checkpoint(storage, registry, 2, model, steps=1, files=("saved_model",))
    loaded = ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-5)
    # and from a local folder directly
    export(model, str(tmp_path / "local" / "saved_model"))
    local = load_model_from_folder(str(tmp_path / "local"))
    np.testing.assert_allclose(local.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-5)


def test_in_place_loaders_read_a_deduplicated_folder_in_its_store(where, tmp_path, monkeypatch):
    """A checkpoint on a local store is deduplicated by default; its folder (MANIFEST.json,
    metadata.json, saved_model/ whole) is still what load_model_from_folder and Determined's
    load_model_from_checkpoint_path take: the files are assembled, verified, into a temporary
    folder removed afterwards. The SavedModel is served in place. Copied out of its store,
    the folder is refused saying how to get a plain one; a damaged chunk is caught."""
    from ckptstore.checkpointing import blobs, signing

    model = linear_model()
    uuid = save_checkpoint(
        where.storage, where.registry, 12, model, steps=1, files=("keras", "saved_model")
    )
    folder = os.path.join(where.storage, uuid)
    manifest = fmt.parse_manifest(Path(folder, fmt.MANIFEST_NAME).read_bytes(), uuid)
    assert "blobs" in manifest["files"][WEIGHTS_FILE] and not os.path.exists(
        os.path.join(folder, WEIGHTS_FILE)
    )
    expected = model.predict(X, verbose=0)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # Keras 2: this test's folder has Determined's callback layout (model_checkpoint.*), whose
    # loader takes the model to fill, as Determined's does.
    model_arg = {"model": linear_model(seed=1)} if KERAS_MAJOR == 2 else {}
    loaded = [
        load_model_from_folder(folder),
        ckptstore.keras.load_model_from_checkpoint_path(folder, **model_arg),
    ]
    for model_loaded in loaded:
        np.testing.assert_allclose(model_loaded.predict(X, verbose=0), expected, rtol=1e-5)
    assert os.listdir(scratch) == []  # the assembled copies are gone
    served = load_model_from_folder(os.path.join(folder, "saved_model"))  # whole, in place
    np.testing.assert_allclose(served.predict(X, verbose=0), expected, rtol=1e-5)

    copy = tmp_path / "copy" / uuid
    shutil.copytree(folder, copy)
    with pytest.raises(errors.InvalidCheckpoint, match="ckptstore checkpoint download"):
        load_model_from_folder(str(copy))
    key, pub = ec_key_pair(tmp_path)
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)  # as a download would: unsigned refused
    with pytest.raises(errors.SignatureError, match="not signed"):
        ckptstore.keras.load_model_from_checkpoint_path(folder)
    monkeypatch.delenv(signing.VERIFY_KEY_ENV)
    chunk = manifest["files"][WEIGHTS_FILE]["blobs"][-1]["sha256"]
    with open(os.path.join(where.storage, *blobs.blob_key(chunk).split("/")), "r+b") as f:
        f.write(b"\xff\x00")
    with pytest.raises(errors.ChecksumMismatch):
        load_model_from_folder(folder)


@keras3_only(".keras files are Keras 3's checkpoint format (Keras 2: model_checkpoint.*)")
def test_local_path_accepts_any_single_keras_file(tmp_path):
    model = linear_model()
    model.save(str(tmp_path / "whatever.keras"))
    loaded = load_model_from_folder(str(tmp_path))
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    model.save(str(tmp_path / "other.keras"))
    with pytest.raises(errors.ModelLoadError, match="several .keras files"):
        load_model_from_folder(str(tmp_path))


def test_unknown_trial_and_uuid(where_allowed):
    storage, registry = where_allowed
    with pytest.raises(errors.TrialNotFound, match="Trial 404"):
        ckptstore.load_checkpoint_model(trial_id=404, storage=storage, registry=registry)
    with pytest.raises(errors.CheckpointNotFound, match="no-such-uuid"):
        ckptstore.load_checkpoint_model(
            checkpoint_uuid="no-such-uuid", storage=storage, registry=registry
        )
    with Registry(registry) as reg:
        reg.ensure_trial(7)
    with pytest.raises(errors.CheckpointNotFound, match="Trial 7 has no committed"):
        ckptstore.load_checkpoint_model(trial_id=7, storage=storage, registry=registry)
    with pytest.raises(errors.InvalidConfig, match="exactly one"):
        ckptstore.load_checkpoint_model(storage=storage, registry=registry)


def test_missing_model_files(where_allowed):
    storage, registry = where_allowed
    uuid = save_checkpoint(storage, registry, 3, None, steps=1, files=())
    with pytest.raises(errors.ModelLoadError, match=r"expected model\.keras"):
        ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=registry)


def test_checksum_mismatch(where_allowed):
    storage, registry = where_allowed
    uuid = save_checkpoint(storage, registry, 4, linear_model(), steps=1)
    corrupt_stored(storage, uuid, WEIGHTS_FILE)  # the file, or its first chunk
    with pytest.raises(errors.ChecksumMismatch, match=WEIGHTS_FILE):
        ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=registry)


#: Damage to a real checkpoint's manifest, each once a raw OSError/OverflowError on load.
DAMAGE = {
    "file-and-folder": lambda files: files.update({f"{WEIGHTS_FILE}/x": files[WEIGHTS_FILE]}),
    "size-2**70": lambda files: files[WEIGHTS_FILE].update(size=2**70),
    "folder-with-content": lambda files: files.update({"extra/": files[WEIGHTS_FILE]}),
    "bool-size": lambda files: files[WEIGHTS_FILE].update(size=True),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_manifest_is_refused_before_loading(where_allowed, damage):
    storage, registry = where_allowed
    uuid = save_checkpoint(storage, registry, 5, linear_model(), steps=1)
    store = open_storage(storage)
    manifest = fmt.read_manifest(store, uuid)
    DAMAGE[damage](manifest["files"])
    write_manifest(store, uuid, manifest)
    with pytest.raises(errors.InvalidCheckpoint, match=f"{uuid}/MANIFEST.json"):
        ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=registry)


@keras.utils.register_keras_serializable(package="ckptstore_test_loaders")
class Doubler(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


def test_unknown_custom_objects_then_custom_objects(where_allowed):
    storage, registry = where_allowed
    model = keras.Sequential([keras.Input((3,)), Doubler(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    uuid = save_checkpoint(storage, registry, 6, model, steps=1)
    registered = keras.utils.get_custom_objects()
    saved = dict(registered)
    registered.clear()
    try:
        # A module this process has not imported is not imported on the checkpoint's word
        # (here: this test module, hidden from sys.modules): the caller hands the class over.
        module = sys.modules.pop(Doubler.__module__)
        try:
            with pytest.raises(errors.UntrustedCode, match="ckptstore_test_loaders>Doubler"):
                ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
            assert Doubler.__module__ not in sys.modules
        finally:
            sys.modules[Doubler.__module__] = module
        # Imported already, its class is used as is: nothing new is imported (issue 38, #7)
        found = ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
        assert isinstance(found.layers[0], Doubler)
        loaded = ckptstore.load_checkpoint_model(
            checkpoint_uuid=uuid,
            registry=registry,
            custom_objects={"ckptstore_test_loaders>Doubler": Doubler},
        )
    finally:
        registered.update(saved)
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))


def test_lambda_needs_safe_mode_off(where_allowed):
    storage, registry = where_allowed
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Lambda(lambda x: x + 1.0), keras.layers.Dense(1)]
    )
    uuid = save_checkpoint(storage, registry, 8, model, steps=1)
    with pytest.raises(errors.UnsafeCheckpointContent, match="safe_mode=False"):
        ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
    loaded = ckptstore.load_checkpoint_model(
        checkpoint_uuid=uuid, registry=registry, safe_mode=False
    )
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))


def _run_batch_inference(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "batch_inference.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )


@pytest.mark.slow
def test_batch_inference_example(where_allowed, tmp_path, storage_url_factory):
    storage, registry = where_allowed
    model = linear_model()
    uuid = save_checkpoint(storage, registry, 11, model, steps=5, val_loss=0.4)
    np.save(tmp_path / "x.npy", X)
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    expected = model.predict(X, verbose=0)

    out = tmp_path / "out" / "preds.npy"
    done = _run_batch_inference(
        "--trial-id", "11", "--best-by", "val_loss", "--input", str(tmp_path / "x.npy"),
        "--output", str(out), "--registry", registry,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-6)

    s3_prefix = storage_url_factory("s3")
    done = _run_batch_inference(
        "--uuid", uuid, "--input", str(tmp_path / "x.csv"), "--output",
        f"{s3_prefix}/preds.csv", "--registry", registry,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    from ckptstore.storage_backends import open_storage

    with open_storage(s3_prefix) as s3:
        got = np.loadtxt(s3.read_bytes("preds.csv").decode().splitlines(), delimiter=",")
    np.testing.assert_allclose(got, expected, rtol=1e-5)

    missing = _run_batch_inference(
        "--uuid", "nope", "--input", str(tmp_path / "x.npy"), "--output", str(out),
        "--registry", registry, "--storage", storage,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "CheckpointNotFound" in missing.stderr


# ---- a checkpoint never chooses what code is imported (issue 27, finding 1) ----------------------
class Halver(keras.layers.Layer):
    """Not registered: a config names it by its module, which a loader must not import."""

    def call(self, x):
        return x * 0.5


#: A module planted on sys.path: importing it writes a marker file (what an attacker's does).
PLANTED = """
import pathlib
from tests.keras_io.keras_under_test import keras

pathlib.Path({marker!r}).write_text("imported")


@keras.utils.register_keras_serializable(package="planted")
class Halver(keras.layers.Layer):
    def call(self, x):
        return x * 0.5
"""


def _rename_code(config: dict, module: str, registered: str) -> dict:
    """``config`` with Halver's module and registered name replaced (an attacker's edit)."""
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("module") == Halver.__module__:
                node.update(module=module, registered_name=registered)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return config


def save_naming(storage, registry, module: str, registered: str) -> str:
    """A committed checkpoint whose model config names ``module`` for its Halver layer."""
    import json
    import zipfile

    model = keras.Sequential([keras.Input((3,)), Halver(), keras.layers.Dense(1)])
    with init(storage=storage, registry=registry, trial_id=9, preempt_signals=False) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            if KERAS_MAJOR == 3:
                plain = os.path.join(path, "plain.keras")
                model.save(plain)
                with (
                    zipfile.ZipFile(plain) as src,
                    zipfile.ZipFile(os.path.join(path, "model.keras"), "w") as dst,
                ):
                    for item in src.infolist():
                        data = src.read(item)
                        if item.filename == "config.json":
                            data = json.dumps(_rename_code(json.loads(data), module, registered))
                        dst.writestr(item, data)
                os.remove(plain)
            else:
                model.save_weights(os.path.join(path, "model_checkpoint"))
                config = _rename_code(json.loads(model.to_json()), module, registered)
                Path(path, "model_config.json").write_text(json.dumps(config))
    return uuid


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The planted module's name, importable (sys.path and the children's PYTHONPATH), and
    its marker file."""
    name = f"planted_{os.getpid()}"
    marker = tmp_path / "imported.txt"
    (tmp_path / f"{name}.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(sys.modules, "this", raising=False)
    return name, marker


def test_a_checkpoint_naming_a_module_never_imports_it(where_allowed, planted):
    from ckptstore.keras_io.exporting import export_checkpoint
    from tests.cli.helpers import Env

    storage, registry = where_allowed
    name, marker = planted
    zen = save_naming(storage, registry, "this", "Halver")  # `import this` prints the Zen
    evil = save_naming(storage, registry, name, "planted>Halver")
    for uuid, module in ((zen, "this"), (evil, name)):
        with pytest.raises(errors.UntrustedCode, match=f"--module {module}"):
            ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, registry=registry)
        with pytest.raises(errors.UntrustedCode, match=f"modules=\\['{module}'\\]"):
            export_checkpoint(uuid, registry=registry, storage=storage)
    result = Env(storage, registry, "").run("checkpoint", "export", evil)
    assert result.exit_code == 5 and "UntrustedCode" in result.output, result.output
    assert "this" not in sys.modules and name not in sys.modules and not marker.exists()

    # What the caller hands over loads: the class itself, or the module it allows.
    x = np.ones((2, 3), dtype="float32")
    model = ckptstore.load_checkpoint_model(
        checkpoint_uuid=zen, registry=registry, custom_objects={"Halver": Halver}, compile=False
    )
    assert "this" not in sys.modules and model.predict(x, verbose=0).shape == (2, 1)
    model = ckptstore.load_checkpoint_model(
        checkpoint_uuid=evil, registry=registry, modules=[name], compile=False
    )
    assert marker.exists() and model.predict(x, verbose=0).shape == (2, 1)


def test_a_verify_key_refuses_altered_checkpoints_before_keras(where_allowed, monkeypatch):
    pytest.importorskip("model_signing")
    from ckptstore.checkpointing import signing
    from ckptstore.keras_io.loading import _loaders

    storage, registry = where_allowed
    key, pub = ec_key_pair(Path(storage).parent)
    model = linear_model()
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, key)
    signed = save_checkpoint(storage, registry, 11, model, steps=1)
    monkeypatch.delenv(signing.SIGNING_KEY_ENV)
    unsigned = save_checkpoint(storage, registry, 11, model, steps=2)
    loaded = ckptstore.load_checkpoint_model(
        checkpoint_uuid=signed, registry=registry, verify_key=pub
    )
    np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)  # the environment's key, from here on

    seen = []
    monkeypatch.setattr(_loaders, "load_model_from_folder", lambda *a, **k: seen.append(a))
    with pytest.raises(errors.SignatureError, match="not signed"):
        ckptstore.load_checkpoint_model(checkpoint_uuid=unsigned, registry=registry)
    forge(open_storage(storage), signed, lambda f: f.pop(signing.SIGNATURE_NAME))
    with pytest.raises(errors.SignatureError, match="not signed"):
        ckptstore.load_checkpoint_model(checkpoint_uuid=signed, registry=registry)
    assert seen == []  # Keras never saw either model
