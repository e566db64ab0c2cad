"""SIGKILL a saving process at many seeded points, on local storage and on S3.

Kill points are spread over local serialization, mid-upload, between the files and the
manifest, during GC deletes and during registry writes (hooks inside
:mod:`tests.reliability.crash_worker`, which kills itself with SIGKILL there), plus kills at
random delays from outside. After every kill: every checkpoint a reader can see is complete
(downloaded and verified), ``latest_checkpoint`` (registry and storage scan) returns a
complete one, and the next worker resumes from it. At the end GC with grace period 0 removes
every leftover.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from ckptstore.checkpointing import CheckpointContext, LatestN, list_committed
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.reliability.crash_worker import NAMES, content

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASES = {  # phase -> largest N
    "serialize": 14,
    "upload": 8,
    "manifest": 3,
    "gc": 4,
    "registry": 8,
    "none": 0,
}


def _kill_plan(seed: int, count: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    names = sorted(PHASES)
    plan = [(p, rng.randint(1, PHASES[p]) if PHASES[p] else 0) for p in names]  # each once
    while len(plan) < count:
        p = rng.choice(names)
        plan.append((p, rng.randint(1, PHASES[p]) if PHASES[p] else 0))
    return plan


def _run_worker(storage_url, registry_url, phase, n, rng) -> int:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.crash_worker", storage_url, registry_url,
         phase, str(n)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    ready = proc.stdout.readline()
    if phase == "none" and ready.startswith("READY"):
        time.sleep(rng.uniform(0.05, 1.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    if proc.returncode not in (0, -signal.SIGKILL):
        pytest.fail(f"worker {phase}/{n} exited {proc.returncode}:\n{ready}{out}\n{err[-3000:]}")
    return proc.returncode


def _check_readers(storage_url, registry_url, tmp_path) -> str | None:
    """Everything a reader can see is complete; returns the latest UUID."""
    storage = open_storage(storage_url)
    registry = Registry(registry_url)
    try:
        with CheckpointContext(storage, index=registry, trial_id=1) as ctx:
            for uuid in list_committed(storage):
                dest = tmp_path / f"check-{uuid}"
                ctx.download(uuid, dest)  # verifies sizes and crc32c
                step = int(ctx.get_metadata(uuid)["steps_completed"])
                for name in NAMES:
                    data = (dest / name).read_bytes()
                    assert data == (
                        content(step, name) if name != "step.txt" else str(step).encode()
                    ), f"{uuid}/{name} does not hold step {step}"
            latest = ctx.latest_checkpoint()
            scanned = CheckpointContext(storage, trial_id=1).latest_checkpoint()
            for candidate in (latest, scanned):
                if candidate is not None:
                    assert fmt.is_committed(storage, candidate), f"latest {candidate} is partial"
                    ctx.download(candidate, tmp_path / f"latest-{candidate}")
            return latest
    finally:
        registry.close()
        storage.close()


def _describe(storage, registry, names, total) -> str:
    """What GC left in each of ``names`` (files, commit slot, marker, index row, pins)."""
    rows = {r.uuid: r.state for r in registry.checkpoint_records(trial_id=1, states=None)}
    pinned = registry.protected_checkpoint_uuids()
    lines = [f"{len(names)} of {total} folders GC left are not removed:"]
    for name in names:
        try:
            slot = storage.read_bytes(f"{name}/{fmt.MANIFEST_NAME}")[:80]
        except Exception as exc:  # noqa: BLE001 - a description, whatever the slot holds
            slot = type(exc).__name__
        try:
            marker = storage.read_bytes(f"{name}/{fmt.PENDING_MARKER_NAME}")[:80]
        except Exception as exc:  # noqa: BLE001
            marker = type(exc).__name__
        lines.append(
            f"{name}: files {storage.list(name)}, slot {slot!r}, marker {marker!r}, "
            f"row {rows.get(name)}, pinned {name in pinned}"
        )
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind,kills", [("file", 32), ("s3", 16)])
def test_sigkill_at_random_points_never_exposes_a_partial_checkpoint(
    storage_url_factory, tmp_path, kind, kills, caplog
):
    storage_url = storage_url_factory(kind)
    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    rng = random.Random(f"crash-{kind}")
    killed = {}
    steps_seen = []
    for phase, n in _kill_plan(seed=7 if kind == "file" else 11, count=kills):
        code = _run_worker(storage_url, registry_url, phase, n, rng)
        if code == -signal.SIGKILL:
            killed[phase] = killed.get(phase, 0) + 1
        latest = _check_readers(storage_url, registry_url, tmp_path)
        if latest is not None:
            storage = open_storage(storage_url)
            steps_seen.append(int(ckpt_metadata.read_metadata(storage, latest)["steps_completed"]))
            storage.close()
    assert sum(killed.values()) >= kills - 2, killed
    assert set(killed) == set(PHASES), f"some kill points were never reached: {killed}"
    assert steps_seen and steps_seen == sorted(steps_seen), "training went backwards"
    # a clean run resumes from the latest checkpoint and finishes
    assert _run_worker(storage_url, registry_url, "never", 0, rng) == 0
    # GC with grace period 0 removes every leftover. A kill between the manifest and the
    # registry update leaves a committed checkpoint the registry still calls PENDING; storage
    # is the truth, and GC reconciles such rows before it applies the policy (no reindex).
    storage = open_storage(storage_url)
    registry = Registry(registry_url)
    with CheckpointContext(
        storage, index=registry, trial_id=1, gc_policy=LatestN(2), gc_grace_seconds=0
    ) as ctx:
        with caplog.at_level(logging.WARNING, logger="ckptstore"):
            ctx.gc()
        committed = set(list_committed(storage))
        # what GC removed keeps only its fenced commit slot (a tombstone manifest), so a
        # killed writer's late manifest write cannot commit into it
        leftovers = set(storage.list_children("")) - committed
        not_removed = [u for u in sorted(leftovers) if not fmt.is_removed(storage, u)]
        if not_removed:
            # GC is tolerant: a folder it could not finish (storage slow under the full suite's
            # load: twice in CI a removed folder kept a zero-byte "nested/" key) is logged and
            # the next GC finishes it, as the warning says. A second pass must leave nothing.
            first_pass = _describe(storage, registry, not_removed, len(leftovers))
            ctx.gc()
            committed = set(list_committed(storage))
            leftovers = set(storage.list_children("")) - committed
            not_removed = [u for u in sorted(leftovers) if not fmt.is_removed(storage, u)]
            assert not not_removed, (
                f"after two GC passes: {_describe(storage, registry, not_removed, len(leftovers))}"
                f"\nafter the first: {first_pass}\nGC warnings: {caplog.text[-3000:]}"
            )
        for uuid in committed:  # GC removed stray pending markers; readers never saw them
            assert fmt.PENDING_MARKER_NAME not in fmt.read_manifest(storage, uuid)["files"]
            assert not storage.exists(f"{uuid}/{fmt.PENDING_MARKER_NAME}")
        assert len(committed) == 2
        assert ctx.latest_checkpoint() in committed
    registry.close()
    storage.close()
