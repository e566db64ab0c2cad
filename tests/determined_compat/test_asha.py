"""ASHA as Determined ran it: trials validate at the rung boundaries and pruned ones stop there,
for a TFKerasTrial (the controller) and for a Core API script (``searcher.operations()``), with
Determined's adaptive.yaml shape (``max_length`` form, no ``min_validation_period``)."""

import json

import pytest

from ckptstore.experiment.config import load_config
from ckptstore.registry import Registry
from tests.determined_compat.conftest import (
    ckptstore,
    copy_corpus,
    create_ok,
    create_then_sigterm,
    resume_ok,
)

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end


def _trials(registry, exp_id):
    with Registry(registry) as reg:
        out = []
        for t in reg.list_trials(exp_id):
            steps = [row.steps_completed for row in reg.get_metrics(t.id, "validation")]
            out.append((t, steps))
        return out


def test_core_api_script_is_pruned_at_rungs(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("core_search", tmp_path)
    rungs = load_config(model_dir / "adaptive.yaml").searcher.rung_lengths()
    assert rungs == [16, 32, 64]
    create_ok("adaptive.yaml", model_dir, storage, registry)
    trials = _trials(registry, 1)
    assert len(trials) == 8 and all(t.state == "COMPLETED" for t, _ in trials)
    for _, steps in trials:
        # One validation per operation, each exactly at a rung, in order, from the first.
        assert steps == rungs[: len(steps)]
    finished = [steps for _, steps in trials if steps[-1] == 64]
    pruned = [steps for _, steps in trials if steps[-1] < 64]
    assert finished and pruned, trials
    # The searcher judged each stop: a trial stopped at rung r was not better than the best
    # trial that reached r before it.
    with Registry(registry) as reg:
        best = {}
        for t, steps in trials:
            values = {
                r.steps_completed: r.metrics["val_loss"]
                for r in reg.get_metrics(t.id, "validation")
            }
            last = steps[-1]
            if last < 64 and last in best:
                assert values[last] >= best[last] - 1e-12
            for step, value in values.items():
                best[step] = min(best.get(step, value), value)


def test_tfkerastrial_adaptive_prunes_at_rungs(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("mnist_trial", tmp_path)
    create_ok("adaptive.yaml", model_dir, storage, registry)
    trials = _trials(registry, 1)
    assert len(trials) == 4
    lengths = {t.id: steps[-1] for t, steps in trials}
    for _, steps in trials:
        assert set(steps) <= {16, 32, 64}  # validations only at rungs (no min_validation_period)
    # ASHA's rule with sequential trials: a trial is promoted past a rung only if it is in the top
    # 1/divisor of the trials that reached it (the best one while there are fewer than
    # `divisor`). A trial that cannot learn (lr 0) after one that can must stop at rung 16.
    hparams = {t.id: t.hparams["learning_rate"] for t, _ in trials}
    after_good = [
        tid
        for tid in sorted(hparams)
        if hparams[tid] == 0.0 and 0.5 in [hparams[e] for e in hparams if e < tid]
    ]
    assert after_good, hparams  # the seed makes the sampler put one there
    assert all(lengths[tid] == 16 for tid in after_good), (lengths, hparams)
    shown = ckptstore("experiment", "describe", "1", "--json", storage=storage, registry=registry)
    info = json.loads(shown.stdout)
    best = next(t for t in info["trials"] if t["id"] == info["best_trial"])
    assert best["hparams"]["learning_rate"] == 0.5 and best["batches_trained"] == 64
    for t in info["trials"]:
        if t["batches_trained"] < 64:
            assert t["batches_trained"] in (16, 32)  # stopped at a rung, with a checkpoint there


def test_038_script_reporting_batches_is_stopped_at_rungs(tmp_path, where):
    """0.38's form: time_metric/max_time, validations every 8 batches, no operations(): the
    first report at or past a rung is judged there and a pruned trial is preempted."""
    storage, registry = where
    model_dir = copy_corpus("core_search", tmp_path)
    done = create_ok("adaptive_038.yaml", model_dir, storage, registry)
    output = done.stdout + done.stderr
    trials = _trials(registry, 1)
    assert len(trials) == 8 and all(t.state == "COMPLETED" for t, _ in trials)
    stopped = [steps[-1] for _, steps in trials if steps[-1] < 64]
    assert stopped, trials
    assert all(n in (16, 32) for n in stopped)  # reports every 8 batches: rungs 16 and 32 hit
    assert output.count("STOPPED AT") == len(stopped)
    assert output.count("TRAINED 64 BATCHES") == 8 - len(stopped)


# A 0.38-style Core API script (NumPy): 8 batches, a validation report, a checkpoint, again.
# With WAIT_FOR_PREEMPT_AT set (the first run only), the first trial waits there to be stopped.
PAUSABLE_PY = """
import os
import time

import determined as det
import numpy as np

with det.core.init() as core_context:
    info = det.get_cluster_info()
    lr, weight, batches = info.trial.hparams["lr"], 0.0, 0
    if info.latest_checkpoint:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            weight, batches = np.load(path / "state.npy")
            batches = int(batches)
    x = np.random.RandomState(0).uniform(-1, 1, size=64)
    wait_at = int(os.environ.get("WAIT_FOR_PREEMPT_AT", "0"))
    while batches < 32 and not core_context.preempt.should_preempt():
        for _ in range(8):
            weight -= lr * float(np.mean(2 * (weight * x - 3.0 * x) * x))
            batches += 1
        val_loss = float(np.mean((weight * x - 3.0 * x) ** 2))
        core_context.train.report_validation_metrics(
            batches, {"val_loss": val_loss, "batches": batches}
        )
        with core_context.checkpoint.store_path({"steps_completed": batches}) as (path, _):
            np.save(path / "state.npy", np.array([weight, batches]))
        while batches == wait_at and not core_context.preempt.should_preempt():
            time.sleep(0.1)
"""

PAUSABLE_YAML = """
hyperparameters:
  lr: {type: categorical, vals: [0.0, 0.5]}
searcher:
  name: adaptive_asha
  metric: val_loss
  max_length: {batches: 32}
  max_trials: 2
  divisor: 2
  max_rungs: 2
reproducibility:
  experiment_seed: 1  # the first trial draws lr 0.5 (learns), the second 0.0 (cannot)
entrypoint: python3 train.py
"""


def test_a_trial_paused_before_its_rung_still_prunes_the_next(tmp_path, where):
    """SIGTERM while the first (good) trial is short of its rung (16 batches), then `resume`:
    the paused trial goes on first, so the second (useless) one meets its value at the rung and
    stops there. Before, the second started first, met the rung alone and was promoted, and both
    ran the full 32 batches."""
    storage, registry = where
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(PAUSABLE_PY)
    (model_dir / "adaptive.yaml").write_text(PAUSABLE_YAML)

    def at_8(reg):
        latest = reg.latest_checkpoint(1)
        return latest is not None and latest.steps_completed == 8

    create_then_sigterm(
        "adaptive.yaml", model_dir, storage, registry, at_8, WAIT_FOR_PREEMPT_AT="8"
    )
    resume_ok(model_dir, storage, registry)
    trials = {t.id: (t, steps) for t, steps in _trials(registry, 1)}
    assert sorted(trials) == [1, 2] and all(t.state == "COMPLETED" for t, _ in trials.values())
    assert [trials[i][0].hparams["lr"] for i in (1, 2)] == [0.5, 0.0]
    assert trials[1][1] == [8, 16, 24, 32]  # the paused trial went on from its checkpoint
    assert trials[2][1] == [8, 16]  # stopped at the rung
