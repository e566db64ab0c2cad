"""The checkpoint format: manifest, metadata, verification and safety checks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree

FILES = {"model.keras": b"k" * 1000, "opt/state.bin": os.urandom(5000), "notes.txt": b"hi"}


def test_build_manifest_lists_every_file_with_size_and_crc(tmp_path):
    root = make_tree(str(tmp_path / "ckpt"), FILES)
    os.makedirs(os.path.join(root, "assets"))
    manifest = fmt.build_manifest(root, uuid="u1")
    assert manifest["format_version"] == fmt.FORMAT_VERSION
    assert set(manifest["files"]) == {*FILES, "assets/"}
    for rel, data in FILES.items():
        assert manifest["files"][rel] == {
            "size": len(data),
            "crc32c": ckpt_checksums.crc32c_bytes(data),
        }
    parsed = fmt.parse_manifest(fmt.dump_json(manifest), "u1")
    assert parsed == manifest


def test_manifest_and_metadata_round_trip_through_storage(tmp_path):
    ctx = CheckpointContext(str(tmp_path / "store"), trial_id=4, experiment_id=2)
    src = make_tree(str(tmp_path / "src"), FILES)
    user = {"steps_completed": 12, "epoch": 3, "metrics": {"val_loss": 0.5}, "mine": [1, 2]}
    uuid = ctx.upload(src, user)
    manifest = fmt.read_manifest(ctx.storage, uuid)
    assert set(manifest["files"]) == {*FILES, fmt.METADATA_NAME}
    metadata = ckpt_metadata.read_metadata(ctx.storage, uuid)
    assert metadata == ctx.get_metadata(uuid)
    for key in (
        "uuid",
        "trial_id",
        "experiment_id",
        "continue_id",
        "steps_completed",
        "epoch",
        "metrics",
        "format_version",
        "framework_versions",
        "ckptstore_version",
        "created_at",
    ):
        assert key in metadata, key
    assert metadata["uuid"] == uuid
    assert (metadata["trial_id"], metadata["experiment_id"]) == (4, 2)
    assert metadata["steps_completed"] == 12 and metadata["epoch"] == 3
    assert metadata["metrics"] == {"val_loss": 0.5} and metadata["mine"] == [1, 2]
    assert metadata["framework_versions"]["python"]
    assert fmt.is_committed(ctx.storage, uuid)
    assert scan.list_committed(ctx.storage) == [uuid]
    [record] = scan.scan_checkpoints(ctx.storage)
    assert record.uuid == uuid and record.state == "COMMITTED" and record.steps_completed == 12
    assert record.resources == {rel: e["size"] for rel, e in manifest["files"].items()}
    ctx.close()


def test_framework_versions_never_import_tensorflow():
    code = (
        "import sys; from ckptstore.checkpointing import metadata as f; "
        "v = f.framework_versions(); "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, sys.modules.keys(); "
        "assert 'tensorflow' not in v; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_framework_versions_reports_already_imported_keras(monkeypatch):
    fake = type(sys)("keras")
    fake.__version__ = "9.9.9"
    monkeypatch.setitem(sys.modules, "keras", fake)
    assert ckpt_metadata.framework_versions()["keras"] == "9.9.9"


def test_metadata_must_be_json_serializable():
    with pytest.raises(errors.InvalidConfig, match="JSON-serializable"):
        ckpt_metadata.build_metadata("u", {"bad": object()})


def test_checksum_mismatch_names_the_file(tmp_path):
    root = make_tree(str(tmp_path / "ckpt"), FILES)
    manifest = fmt.build_manifest(root)
    with open(os.path.join(root, "opt", "state.bin"), "r+b") as f:
        f.write(b"X")  # same size, different content
    with pytest.raises(errors.ChecksumMismatch, match="opt/state.bin"):
        fmt.verify_files(root, manifest)
    # A selector that skips the damaged file verifies the rest.
    assert "model.keras" in fmt.verify_files(root, manifest, selector="*.keras")
    os.truncate(os.path.join(root, "notes.txt"), 1)
    with pytest.raises(errors.ChecksumMismatch, match="notes.txt"):
        fmt.verify_files(root, manifest, selector="notes.txt")
    os.unlink(os.path.join(root, "model.keras"))
    with pytest.raises(errors.ChecksumMismatch, match="model.keras.*missing"):
        fmt.verify_files(root, manifest, selector="model.keras")


def test_download_detects_corruption_unless_verify_is_off(tmp_path):
    store = str(tmp_path / "store")
    src = make_tree(str(tmp_path / "src"), FILES)
    with CheckpointContext(store, dedup=False) as ctx:  # whole files (chunks: test_dedup)
        uuid = ctx.upload(src)
    # Damage the stored copy behind ckptstore's back.
    with open(os.path.join(store, uuid, "model.keras"), "r+b") as f:
        f.write(b"Z")
    with CheckpointContext(store) as ctx:
        with pytest.raises(errors.ChecksumMismatch, match="model.keras"):
            ctx.download(uuid, str(tmp_path / "out1"))
        with pytest.raises(errors.ChecksumMismatch, match="model.keras"):
            with ctx.restore_path(uuid):
                pass
    with CheckpointContext(store, verify=False) as ctx:
        ctx.download(uuid, str(tmp_path / "out2"))
        with open(tmp_path / "out2" / "model.keras", "rb") as f:
            assert f.read(1) == b"Z"


@pytest.mark.parametrize(
    "entry",
    ["../escape.txt", "/etc/passwd", "a/../../b", "a//b", "C:/x", "a\\b", "./a", ""],
)
def test_manifest_with_unsafe_entries_is_rejected(entry):
    store = open_storage("memory://fmt-unsafe/root")
    manifest = {
        "format_version": 1,
        "uuid": "u1",
        "files": {entry: {"size": 1, "crc32c": "00000000"}},
    }
    store.write_bytes("u1/MANIFEST.json", json.dumps(manifest).encode())
    with pytest.raises(errors.InvalidCheckpoint, match="Unsafe entry"):
        fmt.read_manifest(store, "u1")
    store.delete("")


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[]",
        b'{"files": {}}',
        b'{"format_version": 99, "files": {}}',
        b'{"format_version": 1, "files": {"a": {"size": -1, "crc32c": "00000000"}}}',
        b'{"format_version": 1, "files": {"a": {"size": 1, "crc32c": "xyz"}}}',
        b'{"format_version": 1, "uuid": "other", "files": {}}',
    ],
)
def test_malformed_manifest_is_invalid_and_skipped_by_readers(data, caplog):
    store = open_storage("memory://fmt-bad/root")
    store.write_bytes("u1/MANIFEST.json", data)
    store.write_bytes("u1/metadata.json", b"{}")
    with pytest.raises(errors.InvalidCheckpoint, match="u1/MANIFEST.json"):
        fmt.read_manifest(store, "u1")
    assert not fmt.is_committed(store, "u1")
    with caplog.at_level(logging.WARNING):
        assert scan.list_committed(store) == []
        assert scan.scan_checkpoints(store) == []
    assert "not a checkpoint" in caplog.text
    store.delete("")


def test_folder_without_manifest_is_ignored_by_readers(tmp_path):
    store = str(tmp_path / "store")
    src = make_tree(str(tmp_path / "src"), FILES)
    with CheckpointContext(store, trial_id=1) as ctx:
        good = ctx.upload(src, {"steps_completed": 1})
        # An interrupted save: files and metadata but no manifest, with more steps.
        make_tree(os.path.join(store, "0f0f0f0f-dead-4bee-8000-000000000000"), FILES)
        with open(
            os.path.join(store, "0f0f0f0f-dead-4bee-8000-000000000000", "metadata.json"), "w"
        ) as f:
            json.dump({"trial_id": 1, "steps_completed": 99}, f)
        assert scan.list_committed(ctx.storage) == [good]
        assert ctx.latest_checkpoint() == good
        with pytest.raises(errors.InvalidCheckpoint, match="MANIFEST.json"):
            ctx.get_metadata("0f0f0f0f-dead-4bee-8000-000000000000")
        with pytest.raises(errors.CheckpointNotFound):
            ctx.get_metadata("11111111-dead-4bee-8000-000000000000")


def test_storage_id_must_be_one_folder_name(tmp_path):
    with CheckpointContext(str(tmp_path / "s")) as ctx:
        for bad in ("../x", "a/b", "", ".hidden"):
            with pytest.raises(errors.InvalidConfig, match="storage_id"):
                ctx.get_metadata(bad)


def test_reserved_names_in_the_callers_folder_are_not_uploaded(tmp_path, caplog):
    src = make_tree(
        str(tmp_path / "src"), {"w.bin": b"1", "MANIFEST.json": b"old", "metadata.json": b"{}"}
    )
    with CheckpointContext(str(tmp_path / "s")) as ctx, caplog.at_level(logging.WARNING):
        uuid = ctx.upload(src, {"steps_completed": 2})
        assert ctx.get_metadata(uuid)["steps_completed"] == 2
        assert set(fmt.read_manifest(ctx.storage, uuid)["files"]) == {"w.bin", "metadata.json"}
    assert "Skipping MANIFEST.json" in caplog.text
