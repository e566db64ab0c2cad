"""Issue 40, findings 5 and 7: durations the protocol compares count time asleep, and every
JSON file a checkpoint holds is read with bounded depth and size."""

from __future__ import annotations

import time

import pytest

from ckptstore.checkpointing import blobs


def test_a_writer_asleep_longer_than_the_belief_age_forgets_which_blobs_are_stored(monkeypatch):
    """time.monotonic stops during suspend; a belief set before a 2 h sleep must be dropped
    when the machine wakes up, or the writer skips blobs a sweep deleted meanwhile."""
    boot = [1000.0]
    real = time.clock_gettime

    def clock_gettime(which: int) -> float:
        return boot[0] if which == time.CLOCK_BOOTTIME else real(which)

    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    known = blobs.KnownBlobs()
    known.set({"a" * 64})
    assert known.get() == frozenset({"a" * 64})
    boot[0] += 2 * 3600  # asleep for two hours: boot time moved, monotonic time did not
    assert known.get() is None


def test_a_callback_state_nested_100000_deep_is_a_typed_invalid_checkpoint():
    from ckptstore import errors
    from ckptstore.keras_io.fit._callback_state import TrainingState

    hostile = '{"epoch": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(errors.InvalidCheckpoint, match="levels deep"):
        TrainingState.from_json(hostile)


@pytest.mark.parametrize("name", ["MANIFEST.json", "metadata.json"])
def test_every_checkpoint_json_file_nested_deep_is_a_typed_invalid_checkpoint(tmp_path, name):
    from ckptstore import errors
    from ckptstore.checkpointing import format as fmt
    from ckptstore.checkpointing import jsonfiles
    from ckptstore.checkpointing import metadata as ckpt_metadata
    from ckptstore.storage_backends import open_storage

    storage = open_storage(str(tmp_path))
    uuid = "00000000-0000-4000-8000-000000000007"
    storage.write_bytes(f"{uuid}/{name}", b"[" * 100_000 + b"]" * 100_000)
    read = fmt.read_manifest if name == "MANIFEST.json" else ckpt_metadata.read_metadata
    with pytest.raises(errors.InvalidCheckpoint, match="levels deep"):
        read(storage, uuid)
    # A string holding brackets is not nesting.
    assert jsonfiles.load_json(b'{"a": "[[[[{{{{"}', "x", 100) == {"a": "[[[[{{{{"}


def _deep_file(folder, name: str) -> str:
    path = folder / name
    path.write_bytes(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    return str(path)


def test_the_json_files_loaders_read_from_a_folder_are_bounded_too(tmp_path):
    """Beyond MANIFEST.json, metadata.json and callback_state.json: Determined's
    load_data.json/metadata.json (the in-place loaders read them), ckptstore's
    optimizers.json and a model config are read with the same bounds: a typed error."""
    from ckptstore import errors
    from ckptstore.import_determined import layouts
    from ckptstore.keras_io.saving import _code_refs, _optimizers

    with pytest.raises(errors.InvalidCheckpoint, match="levels deep"):
        layouts.read_json(_deep_file(tmp_path, "load_data.json"))
    _deep_file(tmp_path, "optimizers.json")
    with pytest.raises(errors.InvalidCheckpoint, match="levels deep"):
        _optimizers.read(str(tmp_path))
    deep = (tmp_path / "load_data.json").read_bytes()
    with pytest.raises(errors.InvalidCheckpoint, match="levels deep"):
        _code_refs.check_code_refs(deep, what="model.keras")
    # A Determined HDF5 model's training_config: an unreadable one is ignored, as before.
    import h5py

    from ckptstore.import_determined import weights

    with h5py.File(tmp_path / "model.h5", "w") as f:
        f.attrs["training_config"] = deep
    with h5py.File(tmp_path / "model.h5", "r") as f:
        assert weights._stored_optimizer_config(f) == ("", {})
