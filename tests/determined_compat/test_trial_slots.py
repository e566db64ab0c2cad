"""A TFKerasTrial with ``resources.slots_per_trial: 2`` (Determined's cifar10_tf_keras
``distributed.yaml`` shape, training on a ``keras.utils.Sequence`` sharded by batch index)
through the local runner: two worker processes under MultiWorkerMirroredStrategy, SIGTERM
pauses both after the chief's checkpoint, ``experiment resume`` continues on two workers, and
the same paused checkpoint also resumes on one, to the same metrics."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore.checkpointing import CheckpointContext
from ckptstore.core import _info as trial_info
from ckptstore.experiment.common import MODEL_DIR_ENV, TRIAL_WORKER_MODULE
from ckptstore.launch.process import child_env
from ckptstore.registry import Registry
from tests.determined_compat.conftest import (
    CLI_TIMEOUT_S,
    ckptstore,
    cli_env,
    copy_corpus,
    create_then_sigterm,
)

pytestmark = pytest.mark.e2e  # runs the ckptstore command and trial workers in processes

MAX_BATCHES = 24  # searcher.max_length of the corpus's distributed.yaml


def _workers_of(storage: str, uuid: str) -> int:
    with CheckpointContext(storage) as ctx:
        return ctx.get_metadata(uuid)["distributed"]["size"]


def _trial_log(storage: str) -> str:
    folder = Path(storage) / "logs" / "1"
    return "".join(p.read_text() for p in sorted(folder.iterdir()))


def _resume_on_one_worker(model_dir, storage: str, registry: str) -> str:
    """The trial worker on its own (no TF_CONFIG: one worker), as the runner starts it."""
    env = cli_env(
        **{
            trial_info.TRIAL_ID_ENV: "1",
            trial_info.EXPERIMENT_ID_ENV: "1",
            trial_info.STORAGE_ENV: storage,
            trial_info.REGISTRY_ENV: registry,
            MODEL_DIR_ENV: str(model_dir),
        }
    )
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", TRIAL_WORKER_MODULE],
        cwd=model_dir,
        env=child_env(env, extra_paths=[str(model_dir)]),  # `import determined`, as the runner
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_cifar_trial_on_two_slots_pauses_and_resumes_on_two_and_one(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("cifar10_trial", tmp_path)
    config = model_dir / "distributed.yaml"
    # No dropout: its masks are drawn per worker, the rest of a step is the same on 1 or 2.
    # Training data: a keras.utils.Sequence of per-slot batches, each worker reading its share
    # of the batch indices (2b + rank for global batch b); one worker reads batch b of 8.
    config.write_text(
        config.read_text()
        .replace("layer1_dropout: 0.25", "layer1_dropout: 0.0")
        .replace("global_batch_size: 8", "data: sequence\n  global_batch_size: 8")
    )
    err = create_then_sigterm(
        "distributed.yaml",
        model_dir,
        storage,
        registry,
        lambda reg: reg.latest_checkpoint(1),
        CIFAR_BATCH_PAUSE_S="0.3",
    )
    assert "PAUSED" in err
    log = _trial_log(storage)  # both workers' output, teed by the runner
    assert "Starting 2 workers" in log
    assert "rank 0 of 2 workers" in log and "rank 1 of 2 workers" in log
    with Registry(registry) as reg:
        assert reg.get_trial(1).state == "PAUSED"
        paused = reg.latest_checkpoint(1)
    assert 8 <= paused.steps_completed < MAX_BATCHES
    assert _workers_of(storage, paused.uuid) == 2

    # The paused trial, copied: its checkpoint resumes on one worker below.
    one = tmp_path / "one"
    shutil.copytree(storage, one / "ckpts")
    shutil.copy(registry.removeprefix("sqlite:///"), one / "registry.db")

    resumed = ckptstore("experiment", "resume", "1", storage=storage, registry=registry)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert "rank 1 of 2 workers" in log
    assert f"Resumed trial 1 from checkpoint {paused.uuid}" in log
    with Registry(registry) as reg:
        assert reg.get_trial(1).state == "COMPLETED"
        final = reg.latest_checkpoint(1)
        rows = reg.get_metrics(1, "validation")
        steps = [row.steps_completed for row in rows]
        on_two = rows[-1].metrics
    assert final.steps_completed == MAX_BATCHES and _workers_of(storage, final.uuid) == 2
    assert steps == sorted(set(steps)) and steps[-1] == MAX_BATCHES  # went on, not from zero

    one_registry = f"sqlite:///{one / 'registry.db'}"
    out = _resume_on_one_worker(model_dir, str(one / "ckpts"), one_registry)
    assert f"Resumed trial 1 from checkpoint {paused.uuid} at batch {paused.steps_completed}" in out
    assert "rank 1 of" not in out
    with Registry(one_registry) as reg:
        assert reg.get_trial(1).state == "COMPLETED"
        alone = reg.latest_checkpoint(1)
        on_one = reg.get_metrics(1, "validation")[-1].metrics
    assert alone.steps_completed == MAX_BATCHES
    assert _workers_of(str(one / "ckpts"), alone.uuid) == 1
    # The same global batches from the same checkpoint: two workers' gradients, averaged, are
    # one worker's; validation is reduced across workers.
    assert on_one == pytest.approx(on_two, rel=1e-4), (on_one, on_two)
