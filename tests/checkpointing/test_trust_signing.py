"""Issue 40, findings 2 and 4: with a verify key, the in-place loaders refuse an altered or
unsigned folder of any layout before Keras opens a file, and a signature only vouches for the
checkpoint (UUID) it was made for."""

from __future__ import annotations

import json
import os
import shutil
import uuid as _uuid
from pathlib import Path

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, signing
from ckptstore.checkpointing import format as fmt
from tests.checkpointing._helpers import ec_key_pair

pytest.importorskip("model_signing")

FILES = {"model.keras": os.urandom(4000), "callback_state.json": b"{}"}


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory):
    return ec_key_pair(tmp_path_factory.mktemp("keys"))


def _commit(store: str, key: str | None, dedup: bool = False) -> str:
    with CheckpointContext(store, dedup=dedup, signing_key=key, gc_policy=None) as ctx:
        with ctx.store_path({"steps_completed": 3}) as (path, uuid):
            for rel, data in FILES.items():
                Path(path, rel).write_bytes(data)
    return uuid


def _loaders():
    from ckptstore.keras import load_model_from_checkpoint_path
    from ckptstore.keras_io.loading import load_model_from_folder

    return [load_model_from_checkpoint_path, load_model_from_folder]


def test_in_place_loaders_refuse_a_swapped_whole_file_model_before_keras_opens_it(
    tmp_path, key_pair, monkeypatch
):
    """Also given the ``.keras`` file itself (both loaders take one): the folder holding it is
    checked, so a swapped file in a signed checkpoint, or a file outside any signed folder,
    is refused too (naming the file does not skip the signature)."""
    key, pub = key_pair
    store = str(tmp_path / "store")
    uuid = _commit(store, key)
    model = Path(store, uuid, "model.keras")
    os.chmod(model, 0o644)
    model.write_bytes(b"swapped model that predicts 666".ljust(4000, b"6"))
    loose = tmp_path / "loose" / "model.keras"
    loose.parent.mkdir()
    loose.write_bytes(FILES["model.keras"])
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    for load in _loaders():
        for path in (os.path.join(store, uuid), str(model)):
            with pytest.raises(errors.SignatureError, match="model.keras"):
                load(path)
        with pytest.raises(errors.SignatureError, match="not signed"):
            load(str(loose))


def test_in_place_loaders_refuse_unsigned_folders_of_every_layout(tmp_path, key_pair, monkeypatch):
    _, pub = key_pair
    store = str(tmp_path / "store")
    whole = os.path.join(store, _commit(store, None))
    dedup = os.path.join(store, _commit(store, None, dedup=True))
    determined = tmp_path / "det-ckpt"  # Determined's layout: files, no manifest
    determined.mkdir()
    (determined / "model.keras").write_bytes(FILES["model.keras"])
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    for load in _loaders():
        for folder in (whole, dedup, str(determined)):
            with pytest.raises(errors.SignatureError, match="not signed"):
                load(folder)


def test_a_signed_checkpoint_replayed_under_a_new_uuid_is_refused(tmp_path, key_pair, monkeypatch):
    key, pub = key_pair
    store = str(tmp_path / "store")
    old = _commit(store, key)
    new = str(_uuid.uuid4())
    # A store writer copies the old, signed checkpoint under a new UUID claiming a later step.
    shutil.copytree(os.path.join(store, old), os.path.join(store, new))
    manifest = json.loads(Path(store, new, fmt.MANIFEST_NAME).read_text())
    Path(store, new, fmt.MANIFEST_NAME).write_bytes(fmt.manifest_bytes(dict(manifest, uuid=new)))
    with CheckpointContext(store, verify_key=pub) as reader:
        reader.download(old, str(tmp_path / "old"))  # the original still verifies
        with pytest.raises(errors.SignatureError, match="made for checkpoint"):
            reader.download(new, str(tmp_path / "new"))
        with pytest.raises(errors.SignatureError, match="made for checkpoint"):
            with reader.restore_path(new):
                pass
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    for load in _loaders():
        with pytest.raises(errors.SignatureError, match="made for checkpoint"):
            load(os.path.join(store, new))


def test_unsigned_metadata_never_chooses_the_trial_class_imported(tmp_path, key_pair, monkeypatch):
    """A Determined <= 0.17 checkpoint names its trial class in metadata.json, which no
    signature covers: with a verify key, trust_code=True imports nothing from it."""
    from ckptstore.keras import load_model_from_checkpoint_path

    key, pub = key_pair
    folder = tmp_path / "det-0.17"
    (folder / "code").mkdir(parents=True)
    sentinel = tmp_path / "imported"
    (folder / "code" / "evil.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\nclass Trial:\n    pass\n"
    )
    (folder / "determined-keras-model.h5").write_bytes(b"\x89HDF not really")
    signing.sign_folder(folder, key)  # every file but metadata.json is signed
    (folder / "metadata.json").write_text(
        json.dumps({"experiment_config": {"entrypoint": "evil:Trial"}, "hparams": {}})
    )
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    with pytest.raises(errors.SignatureError, match="metadata.json"):
        load_model_from_checkpoint_path(folder, trust_code=True)
    assert not sentinel.exists()


class NotATrial:
    """An imported class that is not a trial: a checkpoint naming it must not build it."""

    built: list[object] = []

    def __init__(self, context) -> None:
        NotATrial.built.append(context)


def test_a_weights_only_trial_checkpoint_never_builds_what_its_metadata_names(
    tmp_path, key_pair, monkeypatch
):
    """A ckptstore TFKerasTrial checkpoint of a subclassed model (weights only) names its trial
    class and hparams in metadata.json: an imported class that is no TFKerasTrial is never
    instantiated, and with a verify key the unsigned metadata.json chooses nothing."""
    from ckptstore.keras import load_model_from_checkpoint_path
    from ckptstore.keras_io.trial import model_part

    key, pub = key_pair
    folder = tmp_path / "trial-ckpt"
    folder.mkdir()
    (folder / model_part.SEQUENCER_FILENAME).write_text("{}")
    (folder / model_part.WEIGHTS_FILENAME).write_bytes(b"\x89HDF not really")
    signing.sign_folder(folder, key)  # every file but metadata.json is signed
    spec = f"{__name__}:NotATrial"
    (folder / "metadata.json").write_text(json.dumps({"trial_class": spec, "hparams": {}}))
    assert model_part.weights_only_trial_checkpoint(str(folder))  # Keras 3's layout
    with pytest.raises(errors.ModelLoadError, match="no TFKerasTrial subclass"):
        load_model_from_checkpoint_path(folder)
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    with pytest.raises(errors.SignatureError, match="metadata.json"):
        load_model_from_checkpoint_path(folder)
    assert NotATrial.built == []
