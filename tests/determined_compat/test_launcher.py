"""Determined's iris example shape through ``python3 -m determined.launch.tensorflow -- python3
train.py``, unchanged: one worker on local storage and on the S3 emulator, resume after SIGTERM,
and ``resources.slots_per_trial: 2`` (two workers with TF_CONFIG on this machine)."""

import json

import pytest

from ckptstore.checkpointing import CheckpointContext
from ckptstore.registry import Registry
from tests.determined_compat.conftest import (
    ckptstore,
    copy_corpus,
    create_ok,
    create_then_sigterm,
    paused_at,
    resume_ok,
)

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end


def _describe(exp_id, storage, registry):
    shown = ckptstore(
        "experiment", "describe", str(exp_id), "--json", storage=storage, registry=registry
    )
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_iris_const_through_the_launcher(tmp_path, where_local_and_s3):
    storage, registry = where_local_and_s3
    model_dir = copy_corpus("iris", tmp_path)
    done = create_ok("const.yaml", model_dir, storage, registry)
    output = done.stdout + done.stderr  # trial output is copied to the runner's stdout
    assert "`import determined` uses ckptstore" in output
    assert "ignored here: environment" in done.stderr
    info = _describe(1, storage, registry)
    assert info["state"] == "COMPLETED"
    (trial,) = info["trials"]
    assert trial["state"] == "COMPLETED" and trial["best_metric"] > 0.5
    with Registry(registry) as reg:
        latest = reg.latest_checkpoint(trial["id"])
        assert latest.metadata["epoch"] == 6 and latest.steps_completed == 6 * 15


def test_iris_resumes_after_sigterm(tmp_path, where_local_and_s3):
    storage, registry = where_local_and_s3
    model_dir = copy_corpus("iris", tmp_path)
    raw = (model_dir / "const.yaml").read_text().replace("--epochs 6", "--epochs 12")
    (model_dir / "const.yaml").write_text(raw)
    create_then_sigterm(
        "const.yaml",
        model_dir,
        storage,
        registry,
        lambda reg: reg.latest_checkpoint(1),
        IRIS_EPOCH_PAUSE_S="0.5",
    )
    assert 0 < paused_at(registry) < 12 * 15

    resume_ok(model_dir, storage, registry)
    with Registry(registry) as reg:
        assert reg.get_trial(1).state == "COMPLETED"
        # Exact resume: a run preempted mid-epoch goes on from its next batch.
        assert reg.latest_checkpoint(1).metadata["epoch"] == 12
        assert reg.latest_checkpoint(1).steps_completed == 12 * 15
        steps = [row.steps_completed for row in reg.get_metrics(1, "validation")]
    # Every epoch validated once: the resumed run went on from the checkpoint, not from zero.
    assert len(steps) == len(set(steps)) == 12


def test_iris_two_slots_start_two_workers(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("iris", tmp_path)
    done = ckptstore(
        "experiment",
        "create",
        "distributed.yaml",
        ".",
        storage=storage,
        registry=registry,
        cwd=model_dir,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    output = done.stdout + done.stderr
    assert "Starting 2 workers" in output
    assert "MultiWorkerMirroredStrategy: rank 1 of 2" in output
    info = _describe(1, storage, registry)
    latest = info["trials"][0]["latest_checkpoint"]
    assert info["state"] == "COMPLETED" and latest
    # The checkpoint records how many workers trained it, as on the Ray engine.
    with CheckpointContext(storage) as ctx:
        assert ctx.get_metadata(latest)["distributed"]["size"] == 2


def test_iris_adaptive_prunes_through_the_callback(tmp_path, where):
    """Determined's iris adaptive.yaml shape (launcher + train.py with DeterminedCallback, the
    max_length form): trials report validation metrics every epoch; the first report past the
    rung (30 batches) is judged and a pruned trial checkpoints and stops there.

    The checks are ASHA's rule, whatever learning rates the sampler drew: trials run one at a
    time, so each is judged at the rung against the trials that reached it before; one worse
    than all of them is stopped there, one at least as good as all of them runs on. The
    corpus's ``experiment_seed`` (the search's seed, as on Determined) draws a useless learning
    rate after a good one, so one trial at least is stopped."""
    storage, registry = where
    model_dir = copy_corpus("iris", tmp_path)
    create_ok("adaptive.yaml", model_dir, storage, registry)
    with Registry(registry) as reg:
        trials = sorted(reg.list_trials(1), key=lambda t: t.id)
        assert len(trials) == 4 and all(t.state == "COMPLETED" for t in trials)
        lr = {t.id: t.hparams["learning_rate"] for t in trials}
        trained = {t.id: reg.latest_checkpoint(t.id).steps_completed for t in trials}
        at_rung = {
            t.id: next(
                row.metrics["val_categorical_accuracy"]
                for row in reg.get_metrics(t.id, "validation")
                if row.steps_completed == 30
            )
            for t in trials
        }
    assert set(trained.values()) <= {30, 60}, trained  # stopped at the rung, or ran on
    before: list[float] = []
    for t in sorted(at_rung):
        if before and at_rung[t] < min(before):
            assert trained[t] == 30, (t, trained, at_rung)
        if at_rung[t] >= max(before, default=at_rung[t]):
            assert trained[t] == 60, (t, trained, at_rung)
        before.append(at_rung[t])
    stopped = [t for t in trained if trained[t] == 30]
    assert any(lr[t] < 1e-6 for t in stopped), (lr, trained, at_rung)
