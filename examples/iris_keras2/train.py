"""Determined's Keras 2 Iris script shape on ckptstore: only ``import determined as det`` changed.

The model code is Keras 2 as Determined's users wrote it for TensorFlow <= 2.12: a legacy
``RMSprop`` with ``lr``/``decay``, ``compile(optimizer, loss, [metrics])`` with positional
arguments, ``det.keras.TensorBoard``. On TensorFlow >= 2.16 it runs on ``tf_keras`` with
``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported (Google's migration switch; this
script sets it only when the caller did not choose).

Run as a trial (``CKPTSTORE_TRIAL_ID``, ``CKPTSTORE_STORAGE``, ``CKPTSTORE_REGISTRY``,
``CKPTSTORE_HPARAMS`` set, e.g. by ``ckptstore experiment``): it resumes the trial's latest
checkpoint and SIGTERM saves and stops. Without those variables it trains from scratch.

    TF_USE_LEGACY_KERAS=1 CKPTSTORE_TRIAL_ID=1 CKPTSTORE_STORAGE=/tmp/ckpts \
        python examples/iris_keras2/train.py --epochs 50
"""

import argparse
import csv
import logging
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from tensorflow.keras import callbacks, layers, losses, metrics, models, utils  # noqa: E402
from tensorflow.keras.optimizers import legacy  # noqa: E402

import ckptstore as det  # noqa: E402  (was: import determined as det)
import ckptstore.keras  # noqa: E402, F401  (was: import determined.keras)

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "iris", "iris.csv")
NUM_CLASSES = 3


def read_split(validation: bool):
    """Every fifth flower is held out for validation; labels one-hot, as the original did."""
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [r for i, r in enumerate(rows) if (i % 5 == 0) == validation]
    features = np.array([[float(r[k]) for k in list(r)[:4]] for r in keep], dtype="float32")
    labels = utils.to_categorical([int(r["species"]) for r in keep], num_classes=NUM_CLASSES)
    return features, labels


def main(core_context, strategy, checkpoint, continue_id, hparams, epochs, step_delay):
    train_x, train_y = read_split(validation=False)
    validation_data = read_split(validation=True)

    with strategy.scope():
        inputs = layers.Input(shape=(4,))
        hidden = layers.Dense(hparams["layer1_dense_size"])(inputs)
        outputs = layers.Dense(NUM_CLASSES, activation="softmax")(hidden)
        model = models.Model(inputs=inputs, outputs=outputs)
        optimizer = legacy.RMSprop(
            lr=hparams["learning_rate"], decay=hparams["learning_rate_decay"]
        )
        model.compile(optimizer, losses.categorical_crossentropy, [metrics.categorical_accuracy])

    det_cb = det.keras.DeterminedCallback(
        core_context, checkpoint=checkpoint, continue_id=continue_id, checkpoint_epochs=0
    )
    tb_cb = det.keras.TensorBoard(
        core_context, update_freq="batch", profile_batch=0, histogram_freq=1
    )
    fit_callbacks = [det_cb, tb_cb]
    if step_delay:
        fit_callbacks.append(_Slow(step_delay))  # so a test can interrupt it mid-training
    model.fit(
        x=train_x,
        y=train_y,
        batch_size=hparams["global_batch_size"],
        validation_data=validation_data,
        epochs=epochs,
        callbacks=fit_callbacks,
        verbose=0,
    )
    print(
        f"IRIS DONE checkpoint={det_cb.last_checkpoint} resumed={det_cb.resumed} "
        f"steps={det_cb.steps_completed} preempted={core_context.preempt.acknowledged}",
        flush=True,
    )


class _Slow(callbacks.Callback):
    """Sleeps after each batch (not in the original: lets a test interrupt a short run)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=500, help="how long to train for")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per batch")
    args = parser.parse_args()

    info = det.get_cluster_info()
    if info and info.task_type == "TRIAL":
        continue_id = info.trial.trial_id
        checkpoint = info.latest_checkpoint
        hparams = info.trial.hparams
    else:
        continue_id = "local-train-task"
        checkpoint = None
        hparams = {
            "learning_rate": 1.0e-2,
            "learning_rate_decay": 1.0e-6,
            "layer1_dense_size": 16,
            "global_batch_size": 16,
        }

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, strategy, checkpoint, continue_id, hparams, args.epochs, args.step_delay)
