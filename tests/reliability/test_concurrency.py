"""Many processes saving into one trial, one registry (SQLite and PostgreSQL) and one S3
bucket; GC running at the same time as restores and model registrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from ckptstore.checkpointing import CheckpointContext, list_committed
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = 8
SAVES = 25


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.concurrency_worker", *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_8_processes_x_25_saves_into_one_trial(registry_url, storage_url_factory):
    storage_url = storage_url_factory("s3")
    Registry(registry_url).close()  # migrate once up front (workers also race on open)
    procs = [_spawn("save", storage_url, registry_url, str(w), str(SAVES)) for w in range(WORKERS)]
    saved: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=280)
        assert proc.returncode == 0, err[-3000:]
        assert "locked" not in err.lower() and "deadlock" not in err.lower(), err[-3000:]
        saved += json.loads(out.strip().splitlines()[-1])
    assert len(saved) == len(set(saved)) == WORKERS * SAVES
    registry = Registry(registry_url)
    rows = registry.list_checkpoints(trial_id=1)
    assert {r.uuid for r in rows} == set(saved)
    assert {r.state for r in rows} == {"COMMITTED"}
    steps = sorted(r.steps_completed for r in rows)
    assert steps == sorted(w * 1000 + i for w in range(WORKERS) for i in range(SAVES))
    storage = open_storage(storage_url)
    assert set(list_committed(storage)) == set(saved)
    registry.close()
    storage.close()


@pytest.mark.timeout(300)
def test_gc_never_deletes_restored_or_registered_checkpoints(registry_url, storage_url_factory):
    storage_url = storage_url_factory("s3")
    registry = Registry(registry_url)
    storage = open_storage(storage_url)
    with CheckpointContext(storage, index=registry, trial_id=2) as ctx:
        made = []
        for step in (1, 2):
            with tempfile.TemporaryDirectory() as src:
                with open(os.path.join(src, "w.bin"), "wb") as f:
                    f.write(b"keep me" * 100)
                made.append(ctx.upload(src, {"steps_completed": step}))
    protected, registered = made
    registry.create_model("m").register_version(registered)
    proc = _spawn("gc", storage_url, registry_url, protected)
    out, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, out + err[-3000:]
    committed = set(list_committed(storage))
    assert protected in committed, "GC deleted the checkpoint being restored"
    assert registered in committed, "GC deleted a registered model version's checkpoint"
    # the policy did run: of the 15 new checkpoints only the latest is kept
    rows = registry.list_checkpoints(trial_id=2, states=("COMMITTED", "PARTIALLY_DELETED"))
    assert len(rows) == 3, [(r.uuid, r.steps_completed) for r in rows]
    with CheckpointContext(storage) as check:
        for uuid in (protected, registered):
            check.download(uuid, tempfile.mkdtemp())
    registry.close()
    storage.close()
