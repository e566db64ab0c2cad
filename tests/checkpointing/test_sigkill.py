"""A process killed with SIGKILL at random points while saving never leaves a checkpoint that
readers return incomplete; the next save works and GC cleans the leftovers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptstore.checkpointing import CheckpointContext, KeepAll, blobs, scan
from ckptstore.checkpointing import format as fmt
from tests._helpers.trees import make_tree

REPO = Path(__file__).resolve().parents[2]


def check_committed_checkpoints(
    ctx: CheckpointContext, tmp_path: Path, already_checked: set[str] = frozenset()
) -> list[str]:
    """Download and verify every committed checkpoint not checked before; check latest."""
    committed = scan.list_committed(ctx.storage)
    for uuid in set(committed) - set(already_checked):
        out = tmp_path / f"dl-{uuid}"
        ctx.download(uuid, str(out))  # verifies every size and crc32c
        metadata = ctx.get_metadata(uuid)
        assert (out / "step.txt").read_text() == str(metadata["steps_completed"])
    latest = ctx.latest_checkpoint()
    assert latest is None or latest in committed
    if latest is not None:
        with ctx.restore_path(latest) as path:
            assert os.path.exists(os.path.join(path, "step.txt"))
    return committed


@pytest.mark.slow
def test_sigkill_during_saves_never_exposes_a_partial_checkpoint(local_and_s3_url, tmp_path):
    rng = random.Random(1234)
    url = local_and_s3_url
    seen: set[str] = set()
    for iteration in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.checkpointing.kill_worker", url, str(iteration)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        with CheckpointContext(url, trial_id=1) as ctx:
            committed = check_committed_checkpoints(ctx, tmp_path / f"it{iteration}", seen)
        seen |= set(committed)
    assert seen, "the worker never committed a checkpoint; kill later"

    # The next save and resume work, and GC removes every leftover of the killed saves.
    with CheckpointContext(url, trial_id=1, gc_policy=KeepAll(), gc_grace_seconds=0) as ctx:
        leftovers = set(ctx.storage.list_children("")) - set(scan.list_committed(ctx.storage))
        assert leftovers, "no kill landed inside a save; the test did not test anything"
        src = make_tree(str(tmp_path / "next"), {"step.txt": b"100000"})
        uuid = ctx.upload(src, {"steps_completed": 100000})
        assert ctx.latest_checkpoint() == uuid
        ctx.wait()
        ctx.gc()
        committed = set(scan.list_committed(ctx.storage))
        assert uuid in committed and seen <= committed
        children = {c for c in ctx.storage.list_children("") if c != blobs.BLOBS_DIR}
        # A collected leftover keeps only its fenced commit slot (a tombstone manifest).
        children = {c for c in children if not fmt.is_removed(ctx.storage, c)}
        assert children == committed, "uncommitted leftovers were not collected"
        check_committed_checkpoints(ctx, tmp_path / "final")


def stored_blobs(ctx: CheckpointContext) -> set[str]:
    """SHA-256 of every blob in the prefix (local storage also lists emptied folders)."""
    from ckptstore.checkpointing import blobs

    names = {k.rsplit("/", 1)[-1] for k in ctx.storage.list(blobs.BLOBS_DIR)}
    return {n for n in names if blobs.SHA_RE.match(n)}


@pytest.mark.slow
def test_sigkill_during_dedup_saves_and_blob_sweeps_never_leaves_a_missing_blob(
    local_and_s3_url, tmp_path
):
    """Killed anywhere (uploading blobs, committing, deleting checkpoints, sweeping blobs), a
    deduplicated prefix never holds a committed checkpoint whose blob is gone."""
    from ckptstore.checkpointing import blobs

    rng = random.Random(99)
    url = local_and_s3_url
    for iteration in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.checkpointing.kill_worker", url, str(iteration), "dedup"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.3, 1.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        with CheckpointContext(url, trial_id=1) as ctx:
            check_committed_checkpoints(ctx, tmp_path / f"it{iteration}")
    with CheckpointContext(url, trial_id=1) as ctx:
        committed = scan.list_committed(ctx.storage)
        assert any(
            fmt.read_manifest(ctx.storage, u)["format_version"] == fmt.BLOBS_FORMAT_VERSION
            for u in committed
        ), "no deduplicated checkpoint was committed; kill later"
        stored = stored_blobs(ctx)
        used = set().union(*(fmt.load_manifest(ctx.storage, u).blobs() for u in committed))
        assert used <= stored
    # A final GC with no grace removes every leftover and every blob nothing references.
    with CheckpointContext(url, trial_id=1, gc_policy=KeepAll(), gc_grace_seconds=0) as ctx:
        ctx.gc()
        committed = scan.list_committed(ctx.storage)
        children = set(ctx.storage.list_children("")) - {blobs.BLOBS_DIR}
        assert {c for c in children if not fmt.is_removed(ctx.storage, c)} == set(committed)
        stored = stored_blobs(ctx)
        used = set().union(*(fmt.load_manifest(ctx.storage, u).blobs() for u in committed))
        assert stored == used
        check_committed_checkpoints(ctx, tmp_path / "final")
