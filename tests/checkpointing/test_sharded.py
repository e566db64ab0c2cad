"""Sharded checkpoints and collectives across real processes over loopback TCP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore import errors
from ckptstore.checkpointing import DummyDistributed, ProcessGroup
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.sharded import check_conflicts, merge_metadata
from ckptstore.storage_backends import open_storage
from tests._helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def run_ranks(size: int, mode: str, url: str, tmp_path) -> list[dict]:
    port = free_port()
    procs, outs = [], []
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
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ)))
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
    assert fmt.list_committed(storage) == [uuid]
    manifest = fmt.read_manifest(storage, uuid)
    expected = {f"rank{r}/w.bin" for r in range(3)} | {"metadata.json"}
    if mode == "upload":
        expected.add("common.txt")
    assert set(manifest["files"]) == expected
    metadata = fmt.read_metadata(storage, uuid)
    assert metadata["shared"] == {"r0": 0, "r1": 1, "r2": 2}
    assert metadata["steps_completed"] == 5 and metadata["trial_id"] == 9
    assert all(r["latest"] == uuid for r in results)
    assert not storage.exists(f"{uuid}/{fmt.PENDING_MARKER_NAME}")


@pytest.mark.parametrize("mode", ["conflict", "meta_conflict"])
def test_sharded_conflicts_fail_on_every_rank(mode, storage_url_factory, tmp_path):
    url = storage_url_factory("file")
    results = run_ranks(2, mode, url, tmp_path)
    assert [r["error"] for r in results] == ["CheckpointConflict", "CheckpointConflict"]
    assert "same.bin" in results[0]["message"] or "steps_completed" in results[0]["message"]
    assert fmt.list_committed(open_storage(url)) == []


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
        assert fmt.list_committed(storage) == []
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
