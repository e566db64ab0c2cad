"""Determined's mnist TFKerasTrial shape (``entrypoint: model_def:MNISTTrial``, ``from determined
import keras``, loaders annotated ``-> keras.InputData``) and its const.yaml, unchanged, through
``ckptstore experiment create`` on local storage and on the S3 emulator."""

from ckptstore.registry import Registry
from tests.determined_compat.conftest import copy_corpus, create_ok


def test_mnist_trial_const_runs_unchanged(tmp_path, where):
    storage, registry = where
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
        steps = [row.steps_completed for row in reg.get_metrics(trial.id, "validation")]
        assert steps == [16, 32]
        assert reg.latest_checkpoint(trial.id).steps_completed == 32
