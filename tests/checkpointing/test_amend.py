"""Adding files to a committed checkpoint (``checkpointing.amend``): a process SIGKILLed at any
step leaves the checkpoint readable as it was or complete with the new files; conflicts and bad
input are refused without touching it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, amend, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.registry import Registry
from tests._helpers.trees import make_tree, read_tree

REPO = Path(__file__).resolve().parents[2]
ORIGINAL = {"model.keras": b"k" * 3000, "notes/a.txt": b"a"}


def commit(ctx: CheckpointContext, tmp_path: Path) -> str:
    src = make_tree(str(tmp_path / "orig"), ORIGINAL)
    return ctx.upload(src, {"steps_completed": 5})


def downloaded(ctx: CheckpointContext, uuid: str, out: Path) -> dict[str, bytes]:
    ctx.download(uuid, str(out))  # verifies sizes and crc32c against the manifest
    files = read_tree(str(out))
    files.pop(fmt.METADATA_NAME)
    return files


def run_worker(url: str, uuid: str, src: str, point: str, registry: str | None = None) -> int:
    args = [sys.executable, "-m", "tests.checkpointing.amend_kill_worker", url, uuid, src, point]
    proc = subprocess.run(
        args + ([registry] if registry else []), cwd=REPO, capture_output=True, timeout=120
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.decode()[-2000:]
    return proc.returncode


def test_sigkill_while_adding_leaves_the_checkpoint_as_it_was(local_and_s3_url, tmp_path):
    with CheckpointContext(local_and_s3_url) as ctx:
        uuid = commit(ctx, tmp_path)
        first_try = make_tree(
            str(tmp_path / "try1"),
            {"saved_model/saved_model.pb": b"pb1", "saved_model/variables/v.data": b"v" * 999},
        )
        for i, point in enumerate(("mid_upload", "before_manifest")):
            assert run_worker(local_and_s3_url, uuid, first_try, point) == -signal.SIGKILL
            # readers see exactly the original checkpoint, verified
            assert scan.list_committed(ctx.storage) == [uuid]
            assert downloaded(ctx, uuid, tmp_path / f"dl{i}") == ORIGINAL
            # the leftover: unlisted files, or (deduplicated) the marker protecting new chunks
            leftover = fmt.PENDING_MARKER_NAME if ctx.dedup else "saved_model/saved_model.pb"
            assert leftover in ctx.storage.list(uuid)
        # a later attempt with other files succeeds and removes the unlisted leftovers
        second = {"saved_model/saved_model.pb": b"pb2", "saved_model/fingerprint.pb": b"f"}
        record = amend.add_files(ctx.storage, uuid, make_tree(str(tmp_path / "try2"), second))
        assert downloaded(ctx, uuid, tmp_path / "final") == {**ORIGINAL, **second}
        assert set(record.resources) == set(ORIGINAL) | set(second) | {fmt.METADATA_NAME}
        stored = set(ctx.storage.list(uuid)) - fmt.RESERVED_NAMES
        # A deduplicated checkpoint (the default) gets its new files as chunks too: nothing
        # but the manifest and metadata in the folder; except a SavedModel on a local store,
        # kept whole in place for serving; a whole-file one gets whole files.
        manifest = fmt.read_manifest(ctx.storage, uuid)
        if ctx.dedup and ctx.storage.local_path(uuid) is not None:
            assert stored == set(second)  # saved_model/ whole, in the folder
            assert not any("blobs" in manifest["files"][rel] for rel in second)
            assert manifest["format_version"] == fmt.BLOBS_FORMAT_VERSION
        elif ctx.dedup:
            assert stored == set()
            assert all("blobs" in manifest["files"][rel] for rel in second)
        else:
            assert stored == set(ORIGINAL) | set(second)  # saved_model/variables/v.data went


def test_sigkill_after_the_manifest_is_repaired_by_reindex(tmp_path):
    url = str(tmp_path / "store")
    registry_url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(registry_url) as registry, CheckpointContext(url, index=registry) as ctx:
        uuid = commit(ctx, tmp_path)
        new = {"saved_model/saved_model.pb": b"pb"}
        src = make_tree(str(tmp_path / "new"), new)
        assert run_worker(url, uuid, src, "after_manifest", registry_url) == -signal.SIGKILL
        assert downloaded(ctx, uuid, tmp_path / "dl") == {**ORIGINAL, **new}
        assert "saved_model/saved_model.pb" not in registry.get_checkpoint(uuid).resources
        registry.reindex(ctx.storage)
        assert "saved_model/saved_model.pb" in registry.get_checkpoint(uuid).resources


def test_conflicts_and_bad_input_leave_the_checkpoint_alone(tmp_path):
    with CheckpointContext(str(tmp_path / "store")) as ctx:
        uuid = commit(ctx, tmp_path)
        before = ctx.storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}")
        clash = make_tree(str(tmp_path / "clash"), {"model.keras": b"other"})
        with pytest.raises(errors.CheckpointConflict, match="never replaced"):
            amend.add_files(ctx.storage, uuid, clash)
        reserved = make_tree(str(tmp_path / "reserved"), {fmt.MANIFEST_NAME: b"{}"})
        with pytest.raises(errors.InvalidConfig, match="writes"):
            amend.add_files(ctx.storage, uuid, reserved)
        empty = tmp_path / "empty"
        empty.mkdir()
        with pytest.raises(errors.InvalidConfig, match="no files"):
            amend.add_files(ctx.storage, uuid, str(empty))
        with pytest.raises(errors.InvalidCheckpoint):
            amend.add_files(ctx.storage, "not-committed", clash)
        assert ctx.storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}") == before


def test_a_manifest_changed_meanwhile_is_a_conflict(tmp_path):
    """A partial delete that rewrites the manifest while files are being added wins; the add
    stops before its own rewrite."""
    with CheckpointContext(str(tmp_path / "store")) as ctx:
        uuid = commit(ctx, tmp_path)
        storage = ctx.storage
        real_create, real_upload = storage.write_range_if_absent, storage.upload

        def other_writer_rewrites() -> None:
            if not fmt.read_manifest(storage, uuid).get("partially_deleted"):
                ctx.delete(uuid, globs=["notes/*"])

        def create_then_delete(key, *args, **kw):  # a deduplicated add: chunks go up ...
            result = real_create(key, *args, **kw)
            if key.startswith(".ckptstore-blobs/"):
                other_writer_rewrites()  # ... then the other writer rewrites the manifest
            return result

        def upload_then_delete(local_dir, key, paths=None, progress=None):  # whole files
            result = real_upload(local_dir, key, paths=paths, progress=progress)
            other_writer_rewrites()
            return result

        storage.write_range_if_absent, storage.upload = create_then_delete, upload_then_delete
        src = make_tree(str(tmp_path / "new"), {"saved_model/saved_model.pb": b"pb"})
        with pytest.raises(errors.CheckpointConflict, match="changed"):
            amend.add_files(storage, uuid, src)
        del storage.write_range_if_absent, storage.upload
        manifest = fmt.read_manifest(storage, uuid)
        assert manifest["partially_deleted"] and "notes/a.txt" not in manifest["files"]
        assert "saved_model/saved_model.pb" not in manifest["files"]
        assert downloaded(ctx, uuid, tmp_path / "dl") == {"model.keras": ORIGINAL["model.keras"]}


_name = st.text("abcxyz019_.-", min_size=1, max_size=8).filter(lambda n: n not in (".", ".."))
_tree = st.dictionaries(
    st.lists(_name, min_size=1, max_size=3).map("/".join), st.binary(max_size=64), max_size=5
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(original=_tree, added=_tree, leftover=_tree, clash=st.booleans())
def test_property_add_is_union_or_refused_unchanged(
    tmp_path_factory, original, added, leftover, clash
):
    """Any original tree plus any new tree (under their own folders): the checkpoint afterwards
    downloads, verified, as exactly their union, and unlisted leftovers of an earlier attempt
    under the new folder are gone; a new path that is already listed is refused with the
    manifest unchanged."""
    root = tmp_path_factory.mktemp("amend")
    original = {f"orig/{k}": v for k, v in original.items()} or {"orig/x": b"x"}
    added = {f"new/{k}": v for k, v in added.items()} or {"new/y": b"y"}
    assume(not _prefix_clash(original, added))
    with CheckpointContext(str(root / "store")) as ctx:
        uuid = ctx.upload(make_tree(str(root / "src"), original), {"steps_completed": 1})
        before = ctx.storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}")
        stale = {f"new/{k}.old": b"stale" for k in leftover}
        if stale and not _prefix_clash(added, stale):
            ctx.storage.upload(make_tree(str(root / "stale"), stale), uuid)
        new = dict(added)
        if clash:
            new[next(iter(original))] = b"replacement"
        src = make_tree(str(root / "new"), new)
        if clash:
            with pytest.raises(errors.CheckpointConflict):
                amend.add_files(ctx.storage, uuid, src)
            assert ctx.storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}") == before
            return
        amend.add_files(ctx.storage, uuid, src)
        assert downloaded(ctx, uuid, root / "dl") == {**original, **added}
        stored = set(ctx.storage.list(uuid)) - fmt.RESERVED_NAMES
        # deduplicated: every file is chunks, nothing else in the folder; else whole files
        expected = set() if ctx.dedup else set(original) | set(added)
        assert {r for r in stored if not r.endswith("/")} == expected


def _prefix_clash(a: dict[str, bytes], b: dict[str, bytes]) -> bool:
    """Whether a path of one tree is a folder of the other's (cannot both exist)."""
    paths = set(a) | set(b)
    return any(p.startswith(q + "/") for p in paths for q in paths)


def test_a_sweep_during_an_add_keeps_its_new_chunks(local_and_s3_url, tmp_path):
    """An add to a deduplicated checkpoint uploads chunks no manifest names yet; its pending
    marker protects them from a blob sweep that runs meanwhile (GC keeps a young marker in a
    committed folder: it may be an add in progress)."""
    from ckptstore.checkpointing import blob_gc

    with CheckpointContext(local_and_s3_url, gc_grace_seconds=0, dedup=True) as ctx:
        uuid = commit(ctx, tmp_path)
        storage = ctx.storage
        real_create = storage.write_range_if_absent
        swept: list[list[str]] = []
        once = threading.Lock()  # chunks go up on several threads

        def create_then_gc(key, *args, **kw):  # a chunk created from the staged file
            result = real_create(key, *args, **kw)
            if key.startswith(".ckptstore-blobs/") and once.acquire(blocking=False):
                swept.append(blob_gc.sweep(storage))
            return result

        storage.write_range_if_absent = create_then_gc
        # Not under saved_model/: a local store keeps that whole (no chunks for a sweep to see).
        added = {"extra/model.pb": b"p" * 5000, "extra/v.data": b"v" * 9000}
        amend.add_files(storage, uuid, make_tree(str(tmp_path / "new"), added))
        del storage.write_range_if_absent
        assert swept == [[]]  # the sweep ran and removed nothing
        ctx.gc()  # the marker is gone after the add: nothing stray to collect either
        assert downloaded(ctx, uuid, tmp_path / "dl") == {**ORIGINAL, **added}
        assert blob_gc.check(storage)["missing"] == {}
