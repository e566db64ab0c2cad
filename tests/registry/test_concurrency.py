"""Many processes writing one registry at once lose no row (SQLite file and PostgreSQL).

Four real processes (spawned, not forked) open the same fresh database at the same moment (so
they also race on the schema migration), then each records 25 checkpoints (racing on creating
the same trial rows), creates 5 auto-numbered trials and registers 5 model versions of one
shared model.
"""

from __future__ import annotations

import multiprocessing
import traceback

import pytest

from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.registry import Registry

pytestmark = pytest.mark.e2e  # spawns writer processes

PROCESSES = 4
PER_PROCESS = 25
VERSIONS_PER_PROCESS = 5
AUTO_TRIALS = 5


def _worker(url: str, index: int, barrier, results) -> None:
    try:
        barrier.wait(timeout=120)
        with Registry(url) as registry:
            for j in range(PER_PROCESS):
                registry.record_checkpoint(
                    CheckpointRecord(
                        uuid=f"p{index}-{j:02d}",
                        trial_id=1 + j % 3,  # shared by all processes: races on trial creation
                        experiment_id=1,
                        steps_completed=j,
                        state="COMMITTED",
                        metrics={"loss": float(j)},
                        resources={"model.keras": j},
                    )
                )
            # Auto-numbered trials only after every explicit id exists (else they could take them).
            barrier.wait(timeout=120)
            for _ in range(AUTO_TRIALS):
                registry.create_trial(experiment_id=1)
            model = registry.get_model("shared")
            versions = [
                model.register_version(f"p{index}-{j:02d}").version
                for j in range(VERSIONS_PER_PROCESS)
            ]
        results.put((index, "ok", versions))
    except BaseException:  # noqa: BLE001 - reported to the parent test
        results.put((index, "error", traceback.format_exc()))


def _run_workers(url: str) -> list[tuple]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, i, barrier, results)) for i in range(PROCESSES)]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return out


def test_four_processes_record_100_checkpoints(registry_url):
    # The model must exist before the workers register versions into it.
    with Registry(registry_url) as registry:
        registry.create_model("shared")
    results = _run_workers(registry_url)
    errors = [r for r in results if r[1] != "ok"]
    assert not errors, errors[0][2]

    with Registry(registry_url) as registry:
        rows = registry.list_checkpoints()
        assert len(rows) == PROCESSES * PER_PROCESS
        assert {c.uuid for c in rows} == {
            f"p{i}-{j:02d}" for i in range(PROCESSES) for j in range(PER_PROCESS)
        }
        assert all(c.state == "COMMITTED" and c.experiment_id == 1 for c in rows)
        trials = registry.list_trials()
        assert len(trials) == 3 + PROCESSES * AUTO_TRIALS
        assert len({t.id for t in trials}) == len(trials)
        versions = sorted(v for r in results for v in r[2])
        assert versions == list(range(1, PROCESSES * VERSIONS_PER_PROCESS + 1))
        assert len(registry.get_model("shared").list_versions()) == PROCESSES * VERSIONS_PER_PROCESS


def _open_only(url: str, index: int, barrier, results) -> None:
    try:
        barrier.wait(timeout=120)
        with Registry(url) as registry:
            results.put((index, "ok", registry._db.version))
    except BaseException:  # noqa: BLE001
        results.put((index, "error", traceback.format_exc()))


def test_concurrent_first_open_migrates_once(registry_url):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_open_only, args=(registry_url, i, barrier, results))
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert all(r[1] == "ok" for r in out), [r[2] for r in out if r[1] != "ok"]

    import sqlalchemy as sa

    from ckptstore.registry import migrations, schema

    with Registry(registry_url) as registry:
        with registry._db.engine.connect() as conn:
            applied = conn.execute(
                sa.select(schema.schema_version.c.version).order_by(schema.schema_version.c.version)
            ).scalars()
            assert list(applied) == [m.version for m in migrations.MIGRATIONS]


def test_forked_child_gets_its_own_connections(registry_url):
    import os

    with Registry(registry_url) as registry:
        registry.create_trial(trial_id=1)  # the parent's pool now holds a connection
        pid = os.fork()
        if pid == 0:  # child: write through the inherited Registry object
            code = 1
            try:
                registry.record_checkpoint(
                    CheckpointRecord(uuid="from-child", trial_id=1, state="COMMITTED")
                )
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        registry.record_checkpoint(
            CheckpointRecord(uuid="from-parent", trial_id=1, state="COMMITTED")
        )
        assert {c.uuid for c in registry.list_checkpoints()} == {"from-child", "from-parent"}
