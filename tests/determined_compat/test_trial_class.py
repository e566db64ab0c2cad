"""Determined's mnist TFKerasTrial shape (``entrypoint: model_def:MNISTTrial``, ``from determined
import keras``, loaders annotated ``-> keras.InputData``) and its const.yaml, unchanged, through
``ckptstore experiment create`` on local storage and on the S3 emulator; SIGTERM to the runner
and ``experiment resume`` on the S3 emulator."""

import pytest

from ckptstore.checkpointing import format as fmt
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.determined_compat.conftest import (
    copy_corpus,
    create_ok,
    create_then_sigterm,
    paused_at,
    resume_ok,
)

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end


def test_mnist_trial_const_runs_unchanged(tmp_path, where_local_and_s3):
    storage, registry = where_local_and_s3
    model_dir = copy_corpus("mnist_trial", tmp_path)
    done = create_ok("const.yaml", model_dir, storage, registry)
    output = done.stdout + done.stderr
    assert "`import determined` uses ckptstore" in output
    assert "ignored here: environment" in done.stderr
    with Registry(registry) as reg:
        (trial,) = reg.list_trials(1)
        assert trial.state == "COMPLETED"
        assert reg.get_experiment(1).state == "COMPLETED"
        # searcher.max_length 32 batches, min_validation_period 16 batches
        validations = reg.get_metrics(trial.id, "validation")
        assert [row.steps_completed for row in validations] == [16, 32]
        assert reg.latest_checkpoint(trial.id).steps_completed == 32
        # No checkpoint_policy: Determined's `best` checkpoints after each validation that beats
        # every earlier one (the first always does), plus the end of training.
        best, improved = None, {32}
        for row in validations:
            if best is None or row.metrics["val_accuracy"] > best:
                best = row.metrics["val_accuracy"]
                improved.add(row.steps_completed)
        saved = {c.steps_completed for c in reg.list_checkpoints(trial.id)}
        assert saved == improved and 16 in saved


def test_mnist_trial_resumes_after_sigterm(tmp_path, storage_url_factory):
    storage, registry = storage_url_factory("s3"), f"sqlite:///{tmp_path / 'registry.db'}"
    model_dir = copy_corpus("mnist_trial", tmp_path)
    raw = (model_dir / "const.yaml").read_text().replace("batches: 32", "batches: 64")
    (model_dir / "const.yaml").write_text(raw)
    create_then_sigterm(
        "const.yaml",
        model_dir,
        storage,
        registry,
        lambda reg: reg.get_metrics(1, "validation"),
        MNIST_BATCH_PAUSE_S="0.1",
    )
    assert 16 <= paused_at(registry) < 64

    resume_ok(model_dir, storage, registry)
    with Registry(registry) as reg:
        assert reg.get_trial(1).state == "COMPLETED"
        latest = reg.latest_checkpoint(1)
        assert latest.steps_completed == 64
        steps = [row.steps_completed for row in reg.get_metrics(1, "validation")]
    # S3 with no choice made: incremental checkpoints (format 2), the default for remote storage.
    with open_storage(storage) as store:
        assert fmt.read_manifest(store, latest.uuid)["format_version"] == fmt.BLOBS_FORMAT_VERSION
    # Validated once at each period: the resumed trial went on from its checkpoint.
    assert steps == [16, 32, 48, 64]
