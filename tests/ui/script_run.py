"""A script run for the UI tests: no experiment, just ``core.init`` and a tiny real training
loop (linear regression by gradient descent in NumPy, so no TensorFlow start-up), reporting
metrics and saving a checkpoint every epoch into the registry and storage named by
``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE``. It resumes from the trial's latest checkpoint.

Run: ``python -m tests.ui.script_run MODE TRIAL_ID EPOCHS`` where MODE is ``complete`` (train
EPOCHS epochs), ``crash`` (raise during epoch 2) or ``until-preempted`` (one epoch every
0.3 s until SIGTERM, then checkpoint and stop, as Determined's preemption asks).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import ckptstore as det

BATCHES_PER_EPOCH = 4
#: A file every checkpoint carries unchanged (the page shows it as shared with the previous).
VOCABULARY = "\n".join(f"token{i}" for i in range(400))


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(64, 3)
    return x, x @ np.array([1.5, -2.0, 0.5]) + 0.3


def _save(core_context: det.core.Context, w: np.ndarray, epoch: int, steps: int) -> None:
    with core_context.checkpoint.store_path({"steps_completed": steps, "epoch": epoch}) as (
        path,
        _uuid,
    ):
        np.save(os.path.join(path, "weights.npy"), w)
        with open(os.path.join(path, "vocabulary.txt"), "w") as f:
            f.write(VOCABULARY)


def main() -> None:
    mode, trial_id, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    x, y = _data()
    with det.core.init(trial_id=trial_id) as core_context:
        w, start = np.zeros(4), 0
        latest = core_context.info.latest_checkpoint
        if latest is not None:
            with core_context.checkpoint.restore_path(latest) as path:
                w = np.load(os.path.join(path, "weights.npy"))
            start = int(core_context.checkpoint.get_metadata(latest)["epoch"])
        xb = np.hstack([x, np.ones((len(x), 1))])
        epoch = start
        while mode == "until-preempted" or epoch < epochs:
            epoch += 1
            if mode == "crash" and epoch == 2:
                raise RuntimeError("the training script crashed in epoch 2")
            for _ in range(BATCHES_PER_EPOCH):
                w -= 0.2 * 2 * xb.T @ (xb @ w - y) / len(y)
            loss = float(np.mean((xb @ w - y) ** 2))
            steps = epoch * BATCHES_PER_EPOCH
            train = core_context.train
            train.report_training_metrics(steps, {"loss": loss, "batches": steps, "epochs": epoch})
            train.report_validation_metrics(
                steps, {"val_loss": loss * 1.1, "batches": steps, "epochs": epoch}
            )
            _save(core_context, w, epoch, steps)
            if core_context.preempt.should_preempt():
                return  # checkpointed above: the trial is PAUSED and can resume
            if mode == "until-preempted":
                time.sleep(0.3)


if __name__ == "__main__":
    main()
