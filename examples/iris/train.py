"""Determined's Iris example (iris_tf_keras) on ckptstore: train with checkpoints, resume on re-run.

Checkpoints go to local storage and a SQLite registry by default (``CKPTSTORE_STORAGE`` /
``CKPTSTORE_REGISTRY``, else ``~/.local/share/ckptstore``); ``--storage`` takes any storage URL
(``s3://bucket/prefix``, ``gs://...``, ``az://...``, a folder). SIGTERM or Ctrl-C saves a
checkpoint and stops; running the same command again resumes the trial from its latest checkpoint.

    python examples/iris/train.py --epochs 40
    python examples/iris/train.py --storage s3://my-bucket/iris --trial-id 7

The last line printed is a JSON summary (trial id, checkpoint UUID, epochs run, resumed, ...).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "iris.csv")
NUM_CLASSES = 3


def load_data(path: str = DATA) -> tuple[np.ndarray, np.ndarray]:
    """Features (150, 4) float32 and labels (150,) int64 from the CSV shipped with the example."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([[float(r[k]) for k in list(r)[:4]] for r in rows], dtype="float32")
    y = np.array([int(r["species"]) for r in rows], dtype="int64")
    return x, y


def split(x: np.ndarray, y: np.ndarray) -> tuple[tuple, tuple]:
    """A fixed shuffled 80/20 train/validation split (same on every run)."""
    order = np.random.RandomState(42).permutation(len(x))
    cut = int(0.8 * len(x))
    train, val = order[:cut], order[cut:]
    return (x[train], y[train]), (x[val], y[val])


def build_model(hparams: dict) -> keras.Model:
    """The reference's model: one hidden Dense layer and a softmax over the three species."""
    inputs = keras.Input((4,), name="features")
    normalize = keras.layers.Normalization(
        mean=[5.84, 3.06, 3.76, 1.2], variance=[0.68, 0.19, 3.1, 0.58]
    )
    hidden = keras.layers.Dense(hparams["layer1_dense_size"], activation="relu")(normalize(inputs))
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs, name="iris")
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=hparams["learning_rate"]),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


class StepDelay(keras.callbacks.Callback):
    """Sleeps after each batch so a demo run lasts long enough to be interrupted."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class EpochsRun(keras.callbacks.Callback):
    """Counts the epochs this process trains. ``fit()``'s History cannot: DeterminedCallback
    restores it on resume (it is a stateful callback), so it spans every run of the trial."""

    def __init__(self) -> None:
        super().__init__()
        self.first_epoch: int | None = None
        self.epochs = 0

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch + 1  # 1-based, as Keras prints epochs
        self.epochs += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the Iris model with ckptstore.")
    parser.add_argument("--storage", default=None, help="checkpoint storage URL or folder")
    parser.add_argument(
        "--registry", default=None, help="registry URL (sqlite:///..., postgresql://...)"
    )
    parser.add_argument("--trial-id", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--layer1-dense-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per batch")
    parser.add_argument("--tensorboard", action="store_true", help="also sync TensorBoard logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    hparams = {"learning_rate": args.learning_rate, "layer1_dense_size": args.layer1_dense_size}
    (x_train, y_train), (x_val, y_val) = split(*load_data())
    keras.utils.set_random_seed(0)

    with det.core.init(
        storage=args.storage, registry=args.registry, trial_id=args.trial_id, hparams=hparams
    ) as core_context:
        info = core_context.info
        model = build_model(hparams)
        det_cb = det.keras.DeterminedCallback(
            core_context,
            checkpoint=info.latest_checkpoint,
            continue_id=info.trial.trial_id,
            checkpoint_epochs=1,
        )
        counter = EpochsRun()
        callbacks: list = [det_cb, counter]
        if args.tensorboard:
            callbacks.append(det.keras.TensorBoard(core_context))
        if args.step_delay > 0:
            callbacks.append(StepDelay(args.step_delay))
        history = model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs,
            validation_data=(x_val, y_val),
            callbacks=callbacks,
            verbose=0,
        )
        val = history.history.get("val_accuracy") or [None]
        summary = {
            "trial_id": info.trial.trial_id,
            "checkpoint": det_cb.last_checkpoint,
            "resumed": det_cb.resumed,
            # Epochs begun here: a resumed run first finishes the epoch a preemption cut.
            "epochs_run": counter.epochs,
            "first_epoch": counter.first_epoch,
            "epochs_total": len(history.history.get("loss", [])),
            "steps_completed": det_cb.steps_completed,
            "preempted": core_context.preempt.acknowledged,
            "val_accuracy": val[-1],
        }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
