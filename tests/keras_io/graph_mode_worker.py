"""A process whose TFKerasTrial module turned eager execution off, as TF1-era Determined
model_defs did (``tf.compat.v1.disable_eager_execution()`` at import): the switch is global and
cannot be undone, so ``tests/keras_io/test_graph_mode_keras2.py`` runs this in a fresh interpreter.

It trains ``LegacyOptTrial`` (``tests/keras_io/legacy_trial_model_def.py``) straight through
(trial 1), then preempted after batch 5 and resumed (trial 2), and prints one JSON line: the
statuses, the checkpoint's files, and whether the resumed weights and optimizer state equal the
straight run's; or the ckptstore error a Keras 3 process raises.

Usage: ``python graph_mode_worker.py STORAGE REGISTRY_URL``
"""

import json
import os
import sys

import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import ckptstore  # noqa: E402
from ckptstore import errors  # noqa: E402
from ckptstore.keras_io.trial.controller import TrialController  # noqa: E402
from tests.keras_io.legacy_trial_model_def import LegacyOptTrial  # noqa: E402

CONFIG = {
    "hyperparameters": {"global_batch_size": 8},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 12}},
    "min_validation_period": {"batches": 4},
    "scheduling_unit": 2,
    "entrypoint": "model_def:LegacyOptTrial",
}
HPARAMS = {"global_batch_size": 8, "lr": 0.01, "optimizer": "legacy", "data": "arrays"}


def run(storage, registry, trial_id, preempt_at=None):
    with ckptstore.core.init(
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        hparams=HPARAMS,
        preempt_signals=False,
    ) as core_context:
        LegacyOptTrial.preempt, LegacyOptTrial.preempt_at = core_context.preempt, preempt_at
        controller = TrialController(LegacyOptTrial, core_context, CONFIG, trial_seed=7)
        result = controller.run()
        with core_context.checkpoint.restore_path(result.latest_checkpoint) as path:
            files = sorted(os.listdir(path))
    # get_weights() reads through the session: .numpy() does not exist in graph mode
    state = controller.model.get_weights() + controller.model.optimizer.get_weights()
    return result, files, state


def main(storage, registry):
    try:
        straight, files, want = run(storage, registry, 1)
    except errors.CkptstoreError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    first, _, before = run(storage, registry, 2, preempt_at=5)
    resumed, _, got = run(storage, registry, 2)
    out = {
        "executing_eagerly": tf.executing_eagerly(),
        "statuses": [straight.status, first.status, resumed.status],
        "batches": [straight.batches_trained, first.batches_trained, resumed.batches_trained],
        "files": files,
        "preempted_differs": any((a != b).any() for a, b in zip(want, before, strict=True)),
        "resumed_equal": len(want) == len(got)
        and all((a == b).all() for a, b in zip(want, got, strict=True)),
        "state_arrays": len(want),
        "val_loss": [straight.last_validation["val_loss"], resumed.last_validation["val_loss"]],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
