"""CheckpointContext save/load/delete on real storage backends (local files, memory, S3)."""

from __future__ import annotations

import os
import pathlib

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from tests._helpers.trees import make_tree, read_tree
from tests.checkpointing._helpers import MemoryIndex

FILES = {
    "model.keras": os.urandom(20_000),
    "optimizer/state.bin": os.urandom(3000),
    "optimizer/extra.txt": b"e",
    "assets/vocab.txt": b"a b c",
}


@pytest.fixture(params=("file", "memory", "s3"))
def file_memory_s3_url(request, storage_url_factory) -> str:
    return storage_url_factory(request.param)


def test_upload_download_get_metadata(file_memory_s3_url, tmp_path):
    index = MemoryIndex()
    src = make_tree(str(tmp_path / "src"), FILES)
    with CheckpointContext(file_memory_s3_url, index=index, trial_id=3) as ctx:
        uuid = ctx.upload(src, {"steps_completed": 7, "metrics": {"loss": 1.5}})
        ctx.download(uuid, str(tmp_path / "out"))
        got = read_tree(str(tmp_path / "out"))
        assert {k: v for k, v in got.items() if k != "metadata.json"} == FILES
        assert ctx.get_metadata(uuid)["steps_completed"] == 7
        assert ctx.latest_checkpoint() == uuid
        # selector: a callable, a glob or a list of globs
        ctx.download(uuid, str(tmp_path / "sel"), selector=lambda p: p.startswith("optimizer/"))
        assert set(read_tree(str(tmp_path / "sel"))) == {
            "optimizer/state.bin",
            "optimizer/extra.txt",
        }
        ctx.download(uuid, str(tmp_path / "sel2"), selector="*.keras")
        assert set(read_tree(str(tmp_path / "sel2"))) == {"model.keras"}
    # The index saw PENDING, then COMMITTED with the manifest's resources.
    states = [c[2] for c in index.calls if c[1] == uuid]
    assert states == ["PENDING", "COMMITTED"]
    record = index.records[uuid]
    assert record.resources == {
        **{k: len(v) for k, v in FILES.items()},
        "metadata.json": record.resources["metadata.json"],
    }
    assert record.metrics == {"loss": 1.5} and record.trial_id == 3
    assert record.storage_url


def test_store_path_and_restore_path(file_memory_s3_url, tmp_path):
    with CheckpointContext(file_memory_s3_url, trial_id=1) as ctx:
        with ctx.store_path({"steps_completed": 10}) as (path, uuid):
            make_tree(path, FILES)
            assert not fmt.is_committed(ctx.storage, uuid)
        assert fmt.is_committed(ctx.storage, uuid)
        with ctx.restore_path(uuid) as path:
            got = read_tree(path)
        assert {
            k: v for k, v in got.items() if k not in ("metadata.json", "MANIFEST.json")
        } == FILES
        assert ctx.latest_checkpoint(trial_id=1) == uuid
        assert ctx.latest_checkpoint(trial_id=2) is None
        # No staging folder is left behind (remote storage also holds the deduplicated
        # chunks, in the hidden ``.ckptstore-blobs``).
        assert [c for c in ctx.storage.list_children("") if not c.startswith(".")] == [uuid]


def test_store_path_discards_the_checkpoint_when_the_block_raises(file_memory_s3_url):
    with CheckpointContext(file_memory_s3_url) as ctx:
        with pytest.raises(RuntimeError):
            with ctx.store_path() as (path, uuid):
                make_tree(path, {"a": b"1"})
                raise RuntimeError("training crashed")
        assert scan.list_committed(ctx.storage) == []
        assert ctx.storage.list("") == {}


def test_local_store_path_renames_the_staging_folder(storage_url_factory):
    root = storage_url_factory("file")
    with CheckpointContext(root, dedup=False) as ctx:  # the whole-file layout
        with ctx.store_path() as (path, uuid):
            assert os.path.dirname(path) == root
            assert os.path.basename(path) == fmt.STAGING_PREFIX + uuid
            make_tree(path, {"big.bin": b"x" * 1000})
            inode = os.stat(os.path.join(path, "big.bin")).st_ino
        # Same inode: moved, not copied.
        assert os.stat(os.path.join(root, uuid, "big.bin")).st_ino == inode
        with ctx.restore_path(uuid) as restored:
            # A pathlib.Path, as Determined's restore_path yields.
            assert restored == pathlib.Path(root, uuid)


def test_local_dedup_keeps_the_saved_model_whole_in_place(tmp_path):
    """Deduplicated by default on a local store, except saved_model/: moved (not copied) from
    the staging folder into the checkpoint folder, whole, where TF Serving reads it; the rest
    is chunks. An upload of a folder the caller keeps copies the SavedModel whole too."""
    root = str(tmp_path / "store")
    variables = "saved_model/variables/variables.data-00000-of-00001"
    files = {"saved_model/saved_model.pb": b"pb", variables: os.urandom(5000), **FILES}
    src = make_tree(str(tmp_path / "src"), files)
    with CheckpointContext(root) as ctx:
        with ctx.store_path({"steps_completed": 1}) as (path, moved):
            make_tree(path, files)
            inode = os.stat(os.path.join(path, variables)).st_ino
        copied = ctx.upload(src)
        for uuid in (moved, copied):
            manifest = fmt.read_manifest(ctx.storage, uuid)
            assert manifest["format_version"] == fmt.BLOBS_FORMAT_VERSION
            whole = {r for r, e in manifest["files"].items() if "blobs" not in e}
            assert whole == {"saved_model/saved_model.pb", variables, fmt.METADATA_NAME}
            in_folder = read_tree(os.path.join(root, uuid))
            assert {r: in_folder[r] for r in whole if r in files} == {
                r: files[r] for r in whole if r in files
            }
            assert "model.keras" not in in_folder  # its chunks are in .ckptstore-blobs/
            with ctx.restore_path(uuid) as restored:
                assert {r: v for r, v in read_tree(restored).items() if r in files} == files
    assert os.stat(os.path.join(root, moved, variables)).st_ino == inode  # moved, not copied
    assert os.path.isfile(os.path.join(src, variables))  # the caller's folder is left alone


def test_latest_checkpoint_orders_by_steps(file_memory_s3_url, tmp_path):
    src = make_tree(str(tmp_path / "src"), {"w": b"1"})
    with CheckpointContext(file_memory_s3_url, trial_id=5) as ctx:
        a = ctx.upload(src, {"steps_completed": 30})
        ctx.upload(src, {"steps_completed": 10})
        assert ctx.latest_checkpoint() == a
        c = ctx.upload(src, {"steps_completed": 30})  # same steps: newer wins
        assert ctx.latest_checkpoint() == c


def test_delete_whole_and_partial(file_memory_s3_url, tmp_path):
    index = MemoryIndex()
    src = make_tree(str(tmp_path / "src"), FILES)
    with CheckpointContext(file_memory_s3_url, index=index) as ctx:
        uuid = ctx.upload(src)
        ctx.delete(uuid, globs=["optimizer/*"])
        manifest = fmt.read_manifest(ctx.storage, uuid)
        assert set(manifest["files"]) == {"model.keras", "assets/vocab.txt", "metadata.json"}
        assert manifest["partially_deleted"] is True
        assert not any(k.startswith("optimizer/") for k in ctx.storage.list(uuid))
        assert index.records[uuid].state == "PARTIALLY_DELETED"
        assert set(index.records[uuid].resources) == set(manifest["files"])
        [record] = scan.scan_checkpoints(ctx.storage)
        assert record.state == "PARTIALLY_DELETED"
        # What remains still downloads and verifies.
        ctx.download(uuid, str(tmp_path / "rest"))
        assert set(read_tree(str(tmp_path / "rest"))) == {
            "model.keras",
            "assets/vocab.txt",
            "metadata.json",
        }
        # A glob that matches nothing changes nothing; deleting the rest deletes it all.
        ctx.delete(uuid, globs=["nothing*"])
        ctx.delete(uuid, globs=["*"])
        assert index.records[uuid].state == "DELETED"
        assert fmt.is_removed(ctx.storage, uuid)  # only the tombstone stays
        other = ctx.upload(src)
        ctx.delete(other)
        ctx.delete(other)  # idempotent
        assert scan.list_committed(ctx.storage) == []
        with pytest.raises(errors.CheckpointNotFound):
            ctx.download(other, str(tmp_path / "gone"))
        with pytest.raises(errors.CheckpointNotFound):
            ctx.delete(other, globs=["*.keras"])


def test_non_chief_cannot_save_unsharded(tmp_path):
    from ckptstore.checkpointing import ProcessGroup

    dist = ProcessGroup(rank=1, size=2, port=1)  # never connects: no collective is called
    with CheckpointContext(str(tmp_path / "s"), distributed=dist) as ctx:
        with pytest.raises(errors.InvalidConfig, match="rank 0"):
            ctx.upload(make_tree(str(tmp_path / "src"), {"a": b"1"}))


def test_bad_arguments_are_reported(tmp_path):
    with pytest.raises(errors.InvalidConfig, match="max_in_flight"):
        CheckpointContext(str(tmp_path / "s"), max_in_flight=0)
    with pytest.raises(errors.InvalidConfig, match="gc_policy"):
        CheckpointContext(str(tmp_path / "s"), gc_policy="latest")
    with pytest.raises(errors.InvalidConfig, match="gc_policy has unknown key"):
        CheckpointContext(str(tmp_path / "s"), gc_policy={"save_latest": 1})
    with CheckpointContext(str(tmp_path / "s")) as ctx:
        with pytest.raises(errors.InvalidConfig, match="not a folder"):
            ctx.upload(str(tmp_path / "missing"))
    with pytest.raises(errors.CheckpointError, match="closed"):
        ctx.upload(str(tmp_path))


def test_a_checkpoint_in_another_storage_is_named_where_the_registry_has_it(tmp_path):
    """The first hour: the README's quick start run on a bucket, then again on the default
    storage, resumed its trial from the default storage and said only "No checkpoint <uuid>
    in file://...". With a registry the error names the storage the row records."""
    from ckptstore.registry import Registry

    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    src = str(tmp_path / "src")
    make_tree(src, {"weights.bin": b"w" * 64})
    with Registry(registry_url) as registry:
        with CheckpointContext(str(tmp_path / "bucket"), index=registry, trial_id=7) as there:
            uuid = there.upload(src)
        with CheckpointContext(str(tmp_path / "default"), index=registry, trial_id=7) as here:
            with pytest.raises(errors.CheckpointNotFound) as info:
                here.download(uuid, str(tmp_path / "out"))
    text = str(info.value)
    assert f"the registry records it in file://{tmp_path / 'bucket'}" in text, text
    assert "CKPTSTORE_STORAGE" in text and "core.init() without trial_id" in text
