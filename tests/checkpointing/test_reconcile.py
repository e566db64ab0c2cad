"""Reconciliation of PENDING index rows with storage, and stray pending markers.

A process killed after writing MANIFEST.json but before updating the registry leaves a
checkpoint that storage holds committed and the registry calls PENDING (and, on remote
storage, a ``.ckptstore-pending.json`` marker inside it). Storage is the truth: start-up of a
``CheckpointContext`` and GC reconcile such rows, GC then applies retention to them and
removes the stray marker. PENDING rows whose upload died before the manifest become DELETED
once they are older than the grace period and storage holds nothing of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from ckptstore.checkpointing import CheckpointContext, LatestN, commit, scan
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.index import COMMITTED, DELETED, PENDING
from ckptstore.cli.main import cli
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree
from tests.checkpointing._helpers import MemoryIndex, backdate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOUR = 3600.0


def _src(tmp_path, step: int):
    return make_tree(
        str(tmp_path / f"src-{step}"),
        {"weights.bin": os.urandom(2048), "nested/opt.bin": str(step).encode()},
    )


def _commit_unrecorded(storage, index, tmp_path, step: int, *, marker: bool = True) -> str:
    """The state a kill right after the manifest leaves: committed in storage, PENDING in the
    index, and (remote uploads) the pending marker still inside the checkpoint."""
    ctx = CheckpointContext(storage, trial_id=1)  # no index: nothing recorded
    uuid = ctx.upload(_src(tmp_path, step), {"steps_completed": step, "metrics": {"loss": step}})
    ctx.close()
    metadata = ckpt_metadata.read_metadata(storage, uuid)
    commit.record_pending(index, uuid, metadata, storage.url)
    if marker:
        commit.write_pending_marker(storage, uuid)
    return uuid


def _pending_row(index, uuid: str, *, age_s: float, url: str, trial_id: int = 1) -> None:
    meta = {"uuid": uuid, "trial_id": trial_id, "steps_completed": 99}
    meta["created_at"] = (
        dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=age_s)
    ).isoformat()
    commit.record_pending(index, uuid, meta, url)


# ---- a real kill between the manifest and the registry update ------------------------------------
KILLED_AFTER_MANIFEST = r"""
import os, signal, sys
from ckptstore.checkpointing import CheckpointContext, commit
from ckptstore.registry import Registry
storage_url, registry_url, src = sys.argv[1:4]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
commit.remove_pending_marker = die  # right after write_manifest: marker and registry not updated
commit.record_committed = die
ctx = CheckpointContext(storage_url, index=Registry(registry_url), trial_id=1)
print(ctx.upload(src, {"steps_completed": 7, "metrics": {"val_loss": 0.25}}), flush=True)
"""


@pytest.mark.timeout(120)
def test_kill_after_commit_is_reconciled_at_start_up(registry_url, local_and_s3_url, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_MANIFEST, local_and_s3_url, registry_url,
         _src(tmp_path, 7)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
        timeout=100,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    storage = open_storage(local_and_s3_url)
    (uuid,) = scan.list_committed(storage)
    marker = f"{uuid}/{fmt.PENDING_MARKER_NAME}"
    assert storage.exists(marker)
    with Registry(registry_url) as reg:
        assert reg.get_checkpoint(uuid).state == PENDING
        assert reg.latest_checkpoint(1) is None  # the registry misses it
        # (grace 0: a stray marker younger than the grace may be an amend in progress)
        with CheckpointContext(storage, index=reg, trial_id=1, gc_grace_seconds=0) as ctx:
            row = reg.get_checkpoint(uuid)
            assert row.state == COMMITTED
            assert reg.latest_checkpoint(1).uuid == uuid
            assert ctx.latest_checkpoint() == uuid
            manifest = fmt.read_manifest(storage, uuid)
            assert row.resources == {r: e["size"] for r, e in manifest["files"].items()}
            assert row.metrics == {"val_loss": 0.25} and row.steps_completed == 7
            # exactly what a reindex from storage would record
            (scanned,) = scan.scan_checkpoints(storage)
            assert dataclasses.replace(row.to_record(), created_at=None) == dataclasses.replace(
                scanned, created_at=None
            )
            assert ctx.gc() == []  # keeps it, removes the stray marker
        assert not storage.exists(marker)
        in_folder = {r for r, e in manifest["files"].items() if "blobs" not in e}  # not chunks
        assert set(storage.list(uuid)) == in_folder | {fmt.MANIFEST_NAME}
    storage.close()


# ---- GC applies retention to reconciled checkpoints ----------------------------------------------
def test_gc_applies_retention_to_checkpoints_the_registry_calls_pending(
    registry_url, local_and_s3_url, tmp_path
):
    storage = open_storage(local_and_s3_url)
    with Registry(registry_url) as reg:
        with CheckpointContext(storage, index=reg, trial_id=1) as ctx:
            recorded = ctx.upload(_src(tmp_path, 1), {"steps_completed": 1})
        lost_old = _commit_unrecorded(storage, reg, tmp_path, 2)
        lost_new = _commit_unrecorded(storage, reg, tmp_path, 3)
        with CheckpointContext(
            storage, index=reg, trial_id=2, gc_policy=LatestN(1)
        ) as gc_ctx:  # another trial: on-demand GC reconciles every trial's PENDING rows
            gc_ctx.gc()
        with CheckpointContext(
            storage, index=reg, trial_id=1, gc_policy=LatestN(1), gc_grace_seconds=0
        ) as ctx:
            assert sorted(ctx.gc()) == sorted([recorded, lost_old])
            assert ctx.latest_checkpoint() == lost_new
        assert scan.list_committed(storage) == [lost_new]
        assert reg.get_checkpoint(lost_old).state == DELETED
        assert reg.get_checkpoint(lost_new).state == COMMITTED
        assert not storage.exists(f"{lost_new}/{fmt.PENDING_MARKER_NAME}")
    storage.close()


def test_background_gc_after_a_commit_reconciles_the_trial(registry_url, tmp_path):
    storage = open_storage(str(tmp_path / "store"))
    with Registry(registry_url) as reg:
        ctx = CheckpointContext(storage, index=reg, trial_id=1, gc_policy=LatestN(1))
        lost = _commit_unrecorded(storage, reg, tmp_path, 1)  # after start-up: still PENDING
        assert reg.get_checkpoint(lost).state == PENDING
        newest = ctx.upload(_src(tmp_path, 2), {"steps_completed": 2})
        ctx.wait()  # the GC the commit triggered ran
        ctx.close()
        assert scan.list_committed(storage) == [newest]
        assert reg.get_checkpoint(lost).state == DELETED


def test_cli_gc_reconciles_before_applying_the_policy(registry_url, tmp_path):
    url = str(tmp_path / "store")
    storage = open_storage(url)
    with Registry(registry_url) as reg:
        reg.ensure_trial(1)
        lost = [_commit_unrecorded(storage, reg, tmp_path, s) for s in (1, 2)]
    result = CliRunner().invoke(
        cli, ["--storage", url, "--registry", registry_url, "gc", "--save-trial-best", "0",
              "--yes", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["deleted"] == [lost[0]]
    assert scan.list_committed(storage) == [lost[1]]
    with Registry(registry_url) as reg:
        assert reg.latest_checkpoint(1).uuid == lost[1]
        assert reg.get_checkpoint(lost[0]).state == DELETED


def test_dry_run_reports_but_changes_nothing(tmp_path):
    storage = open_storage(str(tmp_path / "store"))
    index = MemoryIndex()
    lost = [_commit_unrecorded(storage, index, tmp_path, s) for s in (1, 2)]
    with CheckpointContext(storage, index=index, trial_id=1, gc_policy=LatestN(1)) as ctx:
        index.records[lost[0]].state = PENDING  # undo the start-up reconcile for this test
        index.records[lost[1]].state = PENDING
        report = ctx.reconcile(dry_run=True)
        assert sorted(report.committed) == sorted(lost)
        assert ctx.gc(dry_run=True) == [lost[0]]
        assert {r.state for r in index.records.values()} == {PENDING}
        assert scan.list_committed(storage) == sorted(lost)
        assert storage.exists(f"{lost[0]}/{fmt.PENDING_MARKER_NAME}")


# ---- PENDING rows that never committed -----------------------------------------------------------
def test_stale_pending_rows_without_a_manifest_become_deleted(
    registry_url, local_and_s3_url, monkeypatch
):
    storage = open_storage(local_and_s3_url)
    other_url = "s3://somewhere-else/ckpts"
    ids = {
        n: f"00000000-0000-4000-8000-00000000000{i}"
        for i, n in enumerate(("gone", "leftover", "young", "elsewhere", "marker_young"))
    }
    with Registry(registry_url) as reg:
        _pending_row(reg, ids["gone"], age_s=2 * HOUR, url=storage.url)
        _pending_row(reg, ids["leftover"], age_s=2 * HOUR, url=storage.url)
        storage.write_bytes(f"{ids['leftover']}/weights.bin", b"half")
        commit.write_pending_marker(storage, ids["leftover"])
        backdate(monkeypatch, storage, f"{ids['leftover']}/{fmt.PENDING_MARKER_NAME}", 2 * HOUR)
        _pending_row(reg, ids["young"], age_s=10, url=storage.url)  # may still be uploading
        _pending_row(reg, ids["elsewhere"], age_s=2 * HOUR, url=other_url)  # not our storage
        _pending_row(reg, ids["marker_young"], age_s=2 * HOUR, url=storage.url)
        storage.write_bytes(f"{ids['marker_young']}/weights.bin", b"half")
        commit.write_pending_marker(storage, ids["marker_young"])  # its upload started now
        with CheckpointContext(storage, index=reg, trial_id=1) as ctx:
            report = ctx.reconcile()
            assert report.deleted == [] and report.committed == {}  # start-up did it already
            assert reg.get_checkpoint(ids["gone"]).state == DELETED
            assert reg.get_checkpoint(ids["leftover"]).state == PENDING  # GC removes it first
            assert ctx.gc() == [ids["leftover"]]
        states = {n: reg.get_checkpoint(u).state for n, u in ids.items()}
        assert states == {
            "gone": DELETED,
            "leftover": DELETED,
            "young": PENDING,
            "elsewhere": PENDING,
            "marker_young": PENDING,
        }
        assert fmt.is_removed(storage, ids["leftover"]) and storage.exists(ids["marker_young"])
    storage.close()


class _SlowIndex(MemoryIndex):
    """Holds a background upload right after it recorded its PENDING row."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.pending = threading.Event()

    def record_checkpoint(self, record) -> None:
        super().record_checkpoint(record)
        if record.state == PENDING:
            self.pending.set()
            assert self.go.wait(60)


def test_uploads_in_flight_here_are_never_reconciled(storage_url_factory, tmp_path):
    storage = open_storage(storage_url_factory("memory"))  # nothing in storage until upload
    index = _SlowIndex()
    with CheckpointContext(
        storage, index=index, trial_id=1, gc_policy=LatestN(1), gc_grace_seconds=0
    ) as ctx:
        uuid = ctx.upload(_src(tmp_path, 1), {"steps_completed": 1}, background=True)
        assert index.pending.wait(60)
        assert not ctx.reconcile(all_trials=True)
        assert ctx.gc() == []
        assert index.records[uuid].state == PENDING
        index.go.set()
        ctx.wait()
        assert index.records[uuid].state == COMMITTED


# ---- stray markers ---------------------------------------------------------------------------------
def test_gc_removes_stray_markers_but_never_manifest_listed_files(local_and_s3_url, tmp_path):
    storage = open_storage(local_and_s3_url)
    # storage only: no index; grace 0: younger stray markers may be amends in progress
    with CheckpointContext(storage, trial_id=1, gc_grace_seconds=0) as ctx:
        stray = ctx.upload(_src(tmp_path, 1), {"steps_completed": 1})
        commit.write_pending_marker(storage, stray)
        # a checkpoint whose manifest lists a file of that name keeps it (it is data)
        listed = ctx.upload(_src(tmp_path, 2), {"steps_completed": 2})
        storage.write_bytes(f"{listed}/{fmt.PENDING_MARKER_NAME}", b"user data")
        manifest = fmt.read_manifest(storage, listed)
        manifest["files"][fmt.PENDING_MARKER_NAME] = {
            "size": 9,
            "crc32c": ckpt_checksums.crc32c_bytes(b"user data"),
        }
        storage.write_bytes(f"{listed}/{fmt.MANIFEST_NAME}", fmt.dump_json(manifest))
        before = {u: storage.list(u) for u in (stray, listed)}
        assert ctx.gc(dry_run=True) == []
        assert storage.exists(f"{stray}/{fmt.PENDING_MARKER_NAME}")  # dry run: untouched
        assert ctx.gc() == []
        assert not storage.exists(f"{stray}/{fmt.PENDING_MARKER_NAME}")
        after = {u: storage.list(u) for u in (stray, listed)}
        assert after[stray] == {
            r: s for r, s in before[stray].items() if r != fmt.PENDING_MARKER_NAME
        }
        assert after[listed] == before[listed]
        for uuid in (stray, listed):  # still complete and verified
            ctx.download(uuid, tmp_path / f"check-{uuid}")


# ---- races and storage-only mode ---------------------------------------------------------------------
class _DeletingIndex(MemoryIndex):
    """Simulates a GC in another process deleting the checkpoint between reconcile's read of
    the manifest and its write of the COMMITTED row."""

    def __init__(self, storage) -> None:
        super().__init__()
        self.storage = storage
        self.armed = False

    def record_checkpoint(self, record) -> None:
        if self.armed and record.state == COMMITTED:
            self.armed = False
            commit.delete_checkpoint(self.storage, record.uuid, self)
        super().record_checkpoint(record)


def test_reconcile_does_not_resurrect_a_checkpoint_deleted_meanwhile(tmp_path):
    storage = open_storage(str(tmp_path / "store"))
    index = _DeletingIndex(storage)
    uuid = _commit_unrecorded(storage, index, tmp_path, 1)
    with CheckpointContext(storage, index=index, trial_id=2) as ctx:  # trial 2: no start-up work
        index.armed = True
        report = ctx.reconcile(all_trials=True)
    assert uuid not in report.committed
    assert index.records[uuid].state == DELETED
    assert scan.list_committed(storage) == []


def test_without_an_index_there_is_nothing_to_reconcile(tmp_path):
    with CheckpointContext(str(tmp_path / "store"), trial_id=1) as ctx:
        report = ctx.reconcile(all_trials=True)
        assert not report and report.leftovers == []


def test_core_init_resumes_from_a_checkpoint_the_registry_called_pending(registry_url, tmp_path):
    """``ckptstore.core.init`` looks the trial's latest checkpoint up before it creates the
    checkpoint context: it reconciles first, so a resumed run finds the lost commit."""
    from ckptstore.core._context import init

    url = str(tmp_path / "store")
    storage = open_storage(url)
    with Registry(registry_url) as reg:
        with CheckpointContext(storage, index=reg, trial_id=1) as ctx:
            ctx.upload(_src(tmp_path, 1), {"steps_completed": 1})
        lost = _commit_unrecorded(storage, reg, tmp_path, 2)
        assert reg.latest_checkpoint(1).uuid != lost
    with init(storage=url, registry=registry_url, trial_id=1, preempt_signals=False) as core:
        assert core.info.latest_checkpoint == lost
    storage.close()
