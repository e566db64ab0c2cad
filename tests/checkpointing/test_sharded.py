"""Sharded checkpoints and collectives across real processes over loopback TCP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckptstore import errors
from ckptstore.checkpointing import (
    CheckpointContext,
    DummyDistributed,
    ProcessGroup,
    blob_gc,
    scan,
    sharded,
)
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.sharded import check_conflicts, merge_metadata
from ckptstore.storage_backends import open_storage
from tests._helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def run_ranks(size: int, mode: str, url: str, tmp_path, env: dict | None = None) -> list[dict]:
    port = free_port()
    procs, outs = [], []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for rank in range(size):
        out = tmp_path / f"rank{rank}.json"
        outs.append(out)
        cmd = [
            sys.executable,
            "-m",
            "tests.checkpointing.shard_worker",
            "--rank",
            str(rank),
            "--size",
            str(size),
            "--port",
            str(port),
            "--url",
            url,
            "--mode",
            mode,
            "--out",
            str(out),
        ]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}))
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [json.loads(out.read_text()) for out in outs]


def test_single_process_collectives_need_no_sockets():
    for dist in (ProcessGroup.single(), DummyDistributed()):
        assert (dist.rank, dist.size, dist.get_rank(), dist.get_size()) == (0, 1, 0, 1)
        assert dist.allgather(1) == [1] and dist.gather(2) == [2] and dist.broadcast(3) == 3
        assert dist.allgather_local(4) == [4] and dist.broadcast_local(5) == 5
        dist.close()


def test_bad_rank_or_size():
    with pytest.raises(errors.InvalidConfig, match="Received: rank=2"):
        ProcessGroup(rank=2, size=2)
    with pytest.raises(errors.InvalidConfig, match="Received: size=0"):
        ProcessGroup(rank=0, size=0)


def test_collectives_across_four_processes(tmp_path):
    results = run_ranks(4, "collectives", "unused", tmp_path)
    for rank, res in enumerate(results):
        assert res["error"] is None, res
        assert res["allgather"] == [{"r": r} for r in range(4)]
        assert res["gather"] == ([0, 10, 20, 30] if rank == 0 else None)
        assert res["broadcast"] == "from-0"
        node = rank // 2
        assert res["allgather_local"] == [2 * node, 2 * node + 1]
        assert res["broadcast_local"] == f"local-{2 * node}"


@pytest.mark.parametrize("mode", ["upload", "store_path"])
def test_sharded_upload_merges_files_and_metadata(mode, local_and_s3_url, tmp_path):
    results = run_ranks(3, mode, local_and_s3_url, tmp_path)
    assert all(r["error"] is None for r in results), results
    uuids = {r["uuid"] for r in results}
    assert len(uuids) == 1
    [uuid] = uuids
    storage = open_storage(local_and_s3_url)
    assert scan.list_committed(storage) == [uuid]
    manifest = fmt.read_manifest(storage, uuid)
    expected = {f"rank{r}/w.bin" for r in range(3)} | {"metadata.json"}
    if mode == "upload":
        expected.add("common.txt")
    assert set(manifest["files"]) == expected
    metadata = ckpt_metadata.read_metadata(storage, uuid)
    assert metadata["shared"] == {"r0": 0, "r1": 1, "r2": 2}
    assert metadata["steps_completed"] == 5 and metadata["trial_id"] == 9
    assert all(r["latest"] == uuid for r in results)
    assert not storage.exists(f"{uuid}/{fmt.PENDING_MARKER_NAME}")
    # One commit path: deduplicated by default on every storage, every rank's files are blobs
    # named by the one manifest, as a single writer's would be.
    assert fmt.Manifest.of(manifest).deduplicated
    with CheckpointContext(local_and_s3_url, gc_policy=None) as ctx:
        with ctx.restore_path(uuid) as path:
            for r in range(3):
                assert (path / f"rank{r}" / "w.bin").read_bytes() == bytes([r]) * 100


def test_a_signed_sharded_checkpoint_covers_every_ranks_files(tmp_path):
    """With a signing key, the chief signs the logical files of all ranks (hashed by each
    rank in its checksum read): the checkpoint verifies on restore and with model_signing."""
    model_signing = pytest.importorskip("model_signing")
    from ckptstore.checkpointing import signing
    from tests.checkpointing._helpers import ec_key_pair

    key, pub = ec_key_pair(tmp_path)
    url = str(tmp_path / "ckpts")
    results = run_ranks(2, "store_path", url, tmp_path, {signing.SIGNING_KEY_ENV: key})
    assert all(r["error"] is None for r in results), results
    uuid = results[0]["uuid"]
    files = fmt.read_manifest(open_storage(url), uuid)["files"]
    assert {"rank0/w.bin", "rank1/w.bin", signing.SIGNATURE_NAME} <= set(files)
    with CheckpointContext(url, verify_key=pub) as ctx:
        with ctx.restore_path(uuid) as path:
            assert (path / "rank1" / "w.bin").read_bytes() == bytes([1]) * 100
        ctx.download(uuid, tmp_path / "dl")
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub)
    verifier.verify(tmp_path / "dl", tmp_path / "dl" / signing.SIGNATURE_NAME)


def test_sharded_deduplicated_saves_reuse_blobs_and_survive_a_sweep(storage_url_factory, tmp_path):
    url = storage_url_factory("s3")
    first = run_ranks(2, "upload", url, tmp_path / "a")
    second = run_ranks(2, "upload", url, tmp_path / "b")
    assert all(r["error"] is None for r in first + second), first + second
    storage = open_storage(url)
    u1, u2 = first[0]["uuid"], second[0]["uuid"]
    named = [fmt.load_manifest(storage, u).blobs() for u in (u1, u2)]
    assert named[0] and named[0] == named[1]  # same bytes: the second run stored no new blob
    assert blob_gc.sweep(storage) == []  # both manifests name them: nothing to collect
    with CheckpointContext(url, gc_policy=None) as ctx:
        ctx.delete(u1)
        assert blob_gc.sweep(storage) == []  # u2 still names every one of them
        with ctx.restore_path(u2) as path:
            assert (path / "rank1" / "w.bin").read_bytes() == bytes([1]) * 100


@pytest.mark.parametrize("mode", ["conflict", "meta_conflict"])
def test_sharded_conflicts_fail_on_every_rank(mode, storage_url_factory, tmp_path):
    url = storage_url_factory("file")
    results = run_ranks(2, mode, url, tmp_path)
    assert [r["error"] for r in results] == ["CheckpointConflict", "CheckpointConflict"]
    assert "same.bin" in results[0]["message"] or "steps_completed" in results[0]["message"]
    assert scan.list_committed(open_storage(url)) == []


def test_sharded_refusals_fail_on_every_rank_before_anything_is_uploaded(
    storage_url_factory, tmp_path
):
    """Issue 15: a name the content rule refuses on one rank, or metadata the JSON policy refuses
    on the chief, raises on every rank (none is left waiting) and nothing is committed or
    uploaded."""
    for mode in ("bad_name", "bad_metadata"):
        url = storage_url_factory("file")
        results = run_ranks(2, mode, url, tmp_path)
        errors_seen = [r["error"] for r in results]
        assert None not in errors_seen, results
        if mode == "bad_name":
            assert errors_seen == ["CheckpointError", "UnsafeCheckpointPath"]
            assert "back\\\\slash.bin" in results[1]["message"]
        else:
            assert errors_seen == ["InvalidConfig", "CheckpointError"]
        storage = open_storage(url)
        assert scan.list_committed(storage) == []
        for name in storage.list_children(""):  # only the chief's pending marker (GC's to clean)
            assert set(storage.list(name)) <= {fmt.PENDING_MARKER_NAME}, name


def test_merge_and_conflict_helpers():
    assert merge_metadata([{"a": 1, "d": {"x": 1}}, {"a": 1, "d": {"y": 2}}, None]) == {
        "a": 1,
        "d": {"x": 1, "y": 2},
    }
    with pytest.raises(errors.CheckpointConflict, match="'d.x'"):
        merge_metadata([{"d": {"x": 1}}, {"d": {"x": 2}}])
    check_conflicts([["a", "dir/"], ["b", "dir/"]])
    with pytest.raises(errors.CheckpointConflict, match="Ranks 0 and 2"):
        check_conflicts([["a"], ["b"], ["a"]])


def test_the_chief_marker_names_every_rank_blobs_before_any_rank_uploads(
    storage_url_factory, tmp_path, monkeypatch
):
    """GC reads one marker per checkpoint: it must name rank 1's blobs too, or a sweep between
    rank 1's upload and the manifest could condemn them."""
    url = storage_url_factory("s3")
    port = free_port()
    seen: dict[int, list[str]] = {}
    real_upload = sharded._upload_rank

    def peek(storage, dist, uuid, prepared, planned, chunk_bytes, marker):
        marker_bytes = storage.read_bytes(f"{uuid}/{fmt.PENDING_MARKER_NAME}")
        seen[dist.rank] = json.loads(marker_bytes).get("blobs", [])
        return real_upload(storage, dist, uuid, prepared, planned, chunk_bytes, marker)

    monkeypatch.setattr(sharded, "_upload_rank", peek)
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        dist = ProcessGroup(rank=r, size=2, port=port, timeout=60)
        src = tmp_path / f"src{r}"
        src.mkdir()
        (src / f"w{r}.bin").write_bytes(bytes([r + 7]) * 5000)
        try:
            with CheckpointContext(url, distributed=dist, gc_policy=None) as ctx:
                results[r] = ctx.upload(str(src), {"steps_completed": 1}, shard=True)
        except Exception as exc:  # reported below, on the test's thread
            results[r] = exc
        finally:
            dist.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert isinstance(results[0], str) and results[0] == results[1], results
    manifest = fmt.read_manifest(open_storage(url), results[0])
    every_blob = sorted(fmt.Manifest.of(manifest).blobs())
    assert len(every_blob) == 2
    assert seen == {0: every_blob, 1: every_blob}
