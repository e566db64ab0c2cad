"""The blob GC protocol with real processes (:mod:`ckptstore.checkpointing.condemned`): a GC
in another process that is killed, hung or has a wrong clock never makes a save wait and
never leaves a committed checkpoint naming a missing blob."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from ckptstore.checkpointing import CheckpointContext, blob_gc, condemned
from ckptstore.checkpointing import format as fmt
from tests._helpers.trees import make_tree, read_tree

REPO = __file__.rsplit("/tests/", 1)[0]


@pytest.mark.parametrize(
    ("kind", "offset"), [("file", 86400.0), ("s3", -86400.0), ("azure", 86400.0)]
)
def test_a_gc_hung_then_killed_mid_sweep_never_stalls_or_breaks_a_save(
    storage_url_factory, tmp_path, kind, offset
):
    url = storage_url_factory(kind)
    content = {"x.bin": random.Random(1).randbytes(40_000), "y.bin": b"y" * 7000}
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=4096, gc_policy=None) as ctx:
        first = ctx.upload(make_tree(str(tmp_path / "a"), {"x.bin": content["x.bin"]}))
        doomed = fmt.load_manifest(ctx.storage, first).blobs()
        ctx.delete(first)  # x.bin's blobs are unreferenced: the GC condemns them
        gc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.gc_worker", url, str(offset)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert gc.stdout.readline().strip() == "claimed"
            # The GC has read references and hangs before deleting: a save now must neither
            # wait for it nor reuse the blobs it will delete.
            started = time.monotonic()
            second = ctx.upload(make_tree(str(tmp_path / "b"), content))
            took = time.monotonic() - started
        finally:
            gc.kill()
            gc.wait()
            gc.stdout.close()
        # A liveness bound, not a speed claim: the old protocol waited out a 15 min lease.
        assert took < 60, f"the save waited {took:.0f} s for another process's GC"
        entries = fmt.read_manifest(ctx.storage, second)["files"]
        assert "blobs" not in entries["x.bin"] and "blobs" in entries["y.bin"]
        # The killed sweep's claim stays unfinished; the next sweep deletes what it condemned.
        assert set(blob_gc.sweep(ctx.storage)) == doomed
        assert blob_gc.check(ctx.storage)["missing"] == {}
        out = tmp_path / "out"
        ctx.download(second, str(out))
        assert {k: v for k, v in read_tree(str(out)).items() if k in content} == content
        # The killed run may only be hung: until its window closes, saves keep avoiding the
        # blobs it condemned (stored whole, never waiting), and every one of them verifies.
        listing = condemned.read_all(ctx.storage)
        assert any(listing.running(name) for name in listing.condemnations)
        third = ctx.upload(make_tree(str(tmp_path / "c"), content))
        ctx.download(third, str(tmp_path / "out3"))
        assert blob_gc.check(ctx.storage, sample=None)["damaged"] == {}
