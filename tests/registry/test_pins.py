"""Checkpoint pins: protection from GC that other processes see, through the registry.

``CheckpointContext.protect()`` and ``restore_path()`` pin the checkpoint in the registry
(holder ``host:pid:random``, renewed lease, released on close); GC in any process reads
``protected_checkpoint_uuids()``, which includes unexpired pins. Checked on SQLite and
PostgreSQL, with a real second process holding the pins.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, LatestN, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.index import COMMITTED, DELETED, PinningIndex
from ckptstore.checkpointing.pins import PinKeeper
from ckptstore.registry import Registry, migrations, schema
from ckptstore.storage_backends import open_storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _save(ctx: CheckpointContext, src, step: int) -> str:
    (src / "w.bin").write_bytes(os.urandom(64) + str(step).encode())
    return ctx.upload(src, {"steps_completed": step})


# ---- the registry API ---------------------------------------------------------------------------
def test_pins_protect_until_unpinned_or_expired(registry_url):
    with Registry(registry_url) as reg:
        assert isinstance(reg, PinningIndex)
        reg.pin_checkpoint("live", "a:1:x", _now() + dt.timedelta(minutes=5))
        reg.pin_checkpoint("forever", "a:1:x", None)
        reg.pin_checkpoint("stale", "crashed:2:y", _now() - dt.timedelta(seconds=1))
        assert reg.protected_checkpoint_uuids() == {"live", "forever"}
        # two holders on one checkpoint: it stays protected until both are gone
        reg.pin_checkpoint("live", "b:3:z", _now() + dt.timedelta(minutes=5))
        reg.unpin_checkpoint("live", "a:1:x")
        assert "live" in reg.protected_checkpoint_uuids()
        assert [p.holder for p in reg.list_pins("live")] == ["b:3:z"]
        reg.unpin_checkpoint("live", "b:3:z")
        reg.unpin_checkpoint("live", "b:3:z")  # already gone: fine
        assert reg.protected_checkpoint_uuids() == {"forever"}
        # expired pins are not listed unless asked (and are purged by later writes)
        assert all(not p.expired for p in reg.list_pins())
        reg.unpin_checkpoint("forever", "a:1:x")
        assert reg.protected_checkpoint_uuids() == set()


def test_pin_renewal_and_naive_utc(registry_url):
    with Registry(registry_url) as reg:
        reg.pin_checkpoint("c", "h", _now() - dt.timedelta(seconds=5))
        assert "c" not in reg.protected_checkpoint_uuids()
        naive_utc = (_now() + dt.timedelta(minutes=1)).replace(tzinfo=None)
        reg.pin_checkpoint("c", "h", naive_utc)  # renewing the same holder revives it
        (pin,) = reg.list_pins("c")
        assert (
            pin.expires_at is not None
            and abs((pin.expires_at - naive_utc.replace(tzinfo=dt.timezone.utc)).total_seconds())
            < 1e-3
        )
        assert "c" in reg.protected_checkpoint_uuids()


@pytest.mark.parametrize(
    "uuid,holder,expires",
    [
        ("", "h", None),
        ("u", "", None),
        ("u", "h" * 257, None),
        ("u", "h", "tomorrow"),
        (3, "h", None),
    ],
)
def test_bad_pin_arguments_are_typed_errors(registry_url, uuid, holder, expires):
    with Registry(registry_url) as reg:
        with pytest.raises(errors.InvalidConfig, match="Received"):
            reg.pin_checkpoint(uuid, holder, expires)


def test_migration_3_adds_pins_to_an_existing_v2_registry(registry_url):
    with Registry(registry_url) as reg:
        reg.ensure_trial(1)
        with reg._db.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE checkpoint_pins")
            conn.execute(schema.schema_version.delete().where(schema.schema_version.c.version >= 3))
    with Registry(registry_url) as reg:  # an older database: migrated on open
        assert reg._db.version == migrations.LATEST_VERSION >= 3
        assert "checkpoint_pins" in sa.inspect(reg._db.engine).get_table_names()
        assert reg.get_trial(1).id == 1
        reg.pin_checkpoint("u", "h", None)
        assert reg.protected_checkpoint_uuids() == {"u"}


# ---- CheckpointContext pins through the registry -----------------------------------------------
def test_protect_and_restore_path_pin_in_the_registry(registry_url, local_and_s3_url, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with Registry(registry_url) as reg:
        ctx = CheckpointContext(local_and_s3_url, index=reg, trial_id=1)
        first, second = _save(ctx, src, 1), _save(ctx, src, 2)
        holder = ctx.pin_holder
        host, pid, token = holder.split(":")
        assert pid == str(os.getpid()) and host and len(token) == 8
        ctx.protect(first)
        ctx.protect(first)  # idempotent
        assert [p.holder for p in reg.list_pins(first)] == [holder]
        with ctx.restore_path(second) as path:
            assert os.path.isfile(os.path.join(path, "w.bin"))
            assert reg.protected_checkpoint_uuids() == {first, second}
            with ctx.restore_path(second):  # nested use of the same checkpoint
                pass
            assert second in reg.protected_checkpoint_uuids()
        assert reg.protected_checkpoint_uuids() == {first}  # released after the restore
        ctx.close()
        assert reg.list_pins() == []  # close releases every pin


def test_restore_of_a_missing_checkpoint_leaves_no_pin(registry_url, tmp_path):
    with Registry(registry_url) as reg:
        with CheckpointContext(str(tmp_path / "store"), index=reg, trial_id=1) as ctx:
            with pytest.raises(errors.CheckpointNotFound):
                with ctx.restore_path("0b7c6f5e-0000-4000-8000-000000000000"):
                    pass
            assert reg.list_pins() == []


def test_pin_keeper_renews_the_lease(registry_url):
    with Registry(registry_url) as reg:
        keeper = PinKeeper(reg, lease_seconds=300)
        keeper.acquire("u")
        (before,) = reg.list_pins("u")
        assert before.holder == keeper.holder
        assert keeper._thread is not None and keeper._thread.is_alive()
        time.sleep(0.01)
        keeper.renew()
        (after,) = reg.list_pins("u")
        assert after.expires_at > before.expires_at
        keeper.acquire("u")
        keeper.release("u")
        assert reg.protected_checkpoint_uuids() == {"u"}  # one holder left in this process
        keeper.release("u")
        assert reg.protected_checkpoint_uuids() == set()
        keeper.acquire("v")
        keeper.close()
        assert reg.list_pins() == [] and not keeper._thread.is_alive()
        with pytest.raises(errors.InvalidConfig, match="pin_lease_seconds"):
            PinKeeper(reg, lease_seconds=0)


def test_gc_rechecks_pins_before_each_delete(registry_url, tmp_path):
    """A pin taken by another process after GC read the protected set still saves it."""
    src = tmp_path / "src"
    src.mkdir()
    with Registry(registry_url) as reg:
        with CheckpointContext(str(tmp_path / "store"), index=reg, trial_id=1) as ctx:
            uuids = [_save(ctx, src, i) for i in range(1, 4)]
        late = {"done": False}
        real = reg.protected_checkpoint_uuids

        def protected_then_pinned() -> set[str]:
            result = real()
            if not late["done"]:  # the first read, at GC start: pin right after it
                late["done"] = True
                reg.pin_checkpoint(uuids[0], "other:1:late", None)
            return result

        reg.protected_checkpoint_uuids = protected_then_pinned  # type: ignore[method-assign]
        with CheckpointContext(
            str(tmp_path / "store"), index=reg, trial_id=1, gc_policy=LatestN(1)
        ) as gc_ctx:
            assert gc_ctx.gc() == [uuids[1]]
        assert reg.get_checkpoint(uuids[0]).state == COMMITTED


# ---- two real processes -------------------------------------------------------------------------
HOLDER = r"""
import sys, time
from ckptstore.checkpointing import CheckpointContext
from ckptstore.registry import Registry
storage_url, registry_url, protect, restore, lease = sys.argv[1:6]
reg = Registry(registry_url)
ctx = CheckpointContext(storage_url, index=reg, trial_id=1, pin_lease_seconds=float(lease))
ctx.protect(protect)
with ctx.restore_path(restore):
    print("READY", ctx.pin_holder, flush=True)
    sys.stdin.readline()  # hold the pins until the parent says so (or kills us)
ctx.close()
reg.close()
print("DONE", flush=True)
"""


def _start_holder(storage_url, registry_url, protect, restore, lease=600.0):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, storage_url, registry_url, protect, restore, str(lease)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        pytest.fail(f"holder did not start: {line}{proc.communicate()[1][-3000:]}")
    return proc, line.split()[1]


def _gc(storage_url, registry_url) -> list[str]:
    with Registry(registry_url) as reg:
        with CheckpointContext(
            storage_url, index=reg, trial_id=1, gc_policy=LatestN(1)
        ) as ctx:  # fmt: skip
            return ctx.gc()


@pytest.mark.timeout(180)
def test_gc_in_another_process_keeps_what_a_live_process_protects(
    registry_url, local_and_s3_url, tmp_path
):
    src = tmp_path / "src"
    src.mkdir()
    with Registry(registry_url) as reg:
        with CheckpointContext(local_and_s3_url, index=reg, trial_id=1) as ctx:
            resumed, restoring, newest = (_save(ctx, src, i) for i in (1, 2, 3))
    holder, name = _start_holder(local_and_s3_url, registry_url, resumed, restoring)
    try:
        # process B (this one): LatestN(1) would delete both; the live pins keep them
        assert _gc(local_and_s3_url, registry_url) == []
        storage = open_storage(local_and_s3_url)
        assert all(fmt.is_committed(storage, u) for u in (resumed, restoring, newest))
        with Registry(registry_url) as reg:
            assert {p.holder for p in reg.list_pins()} == {name}
        # A leaves cleanly: close() releases its pins, and the next GC deletes them
        out, err = holder.communicate("go\n", timeout=60)
        assert holder.returncode == 0 and "DONE" in out, err[-3000:]
        assert sorted(_gc(local_and_s3_url, registry_url)) == sorted([resumed, restoring])
        assert scan.list_committed(storage) == [newest]
        with Registry(registry_url) as reg:
            assert reg.get_checkpoint(resumed).state == DELETED
            assert reg.list_pins() == []
        storage.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()


@pytest.mark.timeout(180)
def test_pins_of_a_killed_process_expire(registry_url, tmp_path):
    storage_url = str(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    with Registry(registry_url) as reg:
        with CheckpointContext(storage_url, index=reg, trial_id=1) as ctx:
            old, newest = _save(ctx, src, 1), _save(ctx, src, 2)
    holder, name = _start_holder(storage_url, registry_url, old, old, lease=1.0)
    holder.send_signal(signal.SIGKILL)  # no close(), no atexit: the pin stays behind
    holder.communicate()
    with Registry(registry_url) as reg:
        assert [p.holder for p in reg.list_pins(old, include_expired=True)] == [name]
        deadline = time.monotonic() + 60
        while reg.list_pins(old) and time.monotonic() < deadline:
            time.sleep(0.2)  # the lease runs out: nothing renews it any more
        assert reg.list_pins(old) == []
    assert _gc(storage_url, registry_url) == [old]
    assert scan.list_committed(open_storage(storage_url)) == [newest]
