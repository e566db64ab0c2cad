"""Training script the resume tests run in fresh processes (no tests in here).

    python -m tests.keras_io.resume_worker --dir D --epochs 4 [--kill-after-epoch 2]
        [--sigterm-at-step 6] [--continue-id 1] [--checkpoint UUID|latest|none]

Writes ``<dir>/<tag>.npz`` (every model and optimizer variable) and ``<dir>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402
from tests.keras_io.keras_under_test import (  # noqa: E402
    KERAS_MAJOR,
    keras,
    optimizer_variables,
    variable_path,
)

STEPS_PER_EPOCH = 4
BATCH = 8


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS_PER_EPOCH * BATCH, 4).astype("float32")
    y = (x.sum(axis=1) * 1.7).astype("int64") % 3
    return x, y


def build_model() -> keras.Model:
    keras.utils.set_random_seed(1)
    if KERAS_MAJOR == 2:
        # Keras 2's default Dropout draws from TF's legacy stateful ops, which have no state to
        # save; its own switch to tf.random.Generator makes the RNG a checkpointed variable.
        keras.backend.experimental.enable_tf_random_generator()
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class EpochCounter(det.keras.Callback):
    """A user callback with state: counts epochs and remembers the losses seen."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs = 0
        self.losses: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1
        self.losses.append(round(float(logs["loss"]), 6))

    def get_state(self):
        return {"epochs": self.epochs, "losses": self.losses}

    def load_state(self, state):
        self.epochs = state["epochs"]
        self.losses = list(state["losses"])

    def on_checkpoint_end(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "epoch_counter.txt"), "w") as f:
            f.write(str(self.epochs))


class Killer(keras.callbacks.Callback):
    """SIGKILLs this process after an epoch's checkpoint is committed, or sends SIGTERM."""

    def __init__(self, det_cb, kill_after_epoch: int | None, sigterm_at_step: int | None):
        super().__init__()
        self.det_cb = det_cb
        self.kill_after_epoch = kill_after_epoch
        self.sigterm_at_step = sigterm_at_step
        self.epochs_here = 0  # epoch ends in this process (History now spans the resume)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_here += 1

    def on_train_batch_end(self, batch, logs=None):
        if self.sigterm_at_step is not None and self.det_cb.steps_completed == self.sigterm_at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_epoch_begin(self, epoch, logs=None):
        # DeterminedCallback (earlier in the list) has just handed over the checkpoint of the
        # epoch that ended; wait for its commit, then die without any cleanup.
        if self.kill_after_epoch is not None and epoch == self.kill_after_epoch:
            self.det_cb.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--storage", default=None)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--trial-id", type=int, default=1)
    p.add_argument("--continue-id", default=None)
    p.add_argument("--checkpoint", default="latest")
    p.add_argument("--kill-after-epoch", type=int, default=None)
    p.add_argument("--sigterm-at-step", type=int, default=None)
    p.add_argument("--checkpoint-epochs", type=int, default=1)
    p.add_argument("--tag", default="result")
    args = p.parse_args(argv)

    storage = args.storage or os.path.join(args.dir, "ckpts")
    registry = f"sqlite:///{os.path.join(args.dir, 'registry.db')}"
    x, y = data()
    with det.core.init(storage=storage, registry=registry, trial_id=args.trial_id) as ctx:
        checkpoint = {"latest": ctx.info.latest_checkpoint, "none": None}.get(
            args.checkpoint, args.checkpoint
        )
        continue_id = int(args.continue_id) if args.continue_id else ctx.info.trial.trial_id
        model = build_model()
        det_cb = det.keras.DeterminedCallback(
            ctx,
            checkpoint=checkpoint,
            continue_id=continue_id,
            checkpoint_epochs=args.checkpoint_epochs,
            export_saved_model="never",
        )
        stop = det.keras.EarlyStopping(monitor="val_loss", patience=50, min_delta=1e-9)
        plateau = det.keras.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5)
        counter = EpochCounter()
        killer = Killer(det_cb, args.kill_after_epoch, args.sigterm_at_step)
        history = model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=args.epochs,
            shuffle=False,
            validation_data=(x, y),
            verbose=0,
            callbacks=[det_cb, stop, plateau, counter, killer],
        )
        arrays = {f"model/{variable_path(v)}": v.numpy() for v in model.variables}
        arrays.update(
            {f"optimizer/{variable_path(v)}": v.numpy() for v in optimizer_variables(model)}
        )
        np.savez(os.path.join(args.dir, f"{args.tag}.npz"), **arrays)
        summary = {
            "epochs_run": killer.epochs_here,
            "history_epochs": len(history.history.get("loss", [])),
            "steps_completed": det_cb.steps_completed,
            "resumed": det_cb.resumed,
            "last_checkpoint": det_cb.last_checkpoint,
            "iterations": int(model.optimizer.iterations.numpy()),
            "learning_rate": float(keras.backend.get_value(model.optimizer.learning_rate)),
            "early_stopping": stop.get_state(),
            "plateau": plateau.get_state(),
            "counter": counter.get_state(),
            "preempted": ctx.preempt.acknowledged,
        }
    with open(os.path.join(args.dir, f"{args.tag}.json"), "w") as f:
        json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
