"""A Core API script that trains a Keras model for as long as each searcher operation asks,
with one ``model.fit()`` call per operation and a new ``DeterminedCallback`` for each call (the
shape of Determined's Core API tutorials with Keras's ``fit()`` in the loop). The lengths are in
epochs (``max_length: {epochs: N}``); each call continues from the epochs before it.
``KERAS_SEARCH_SLEEP``: seconds to wait after each batch (a test's time to send SIGTERM)."""

import logging
import os
import time

import determined as det
import determined.keras
import numpy as np
import tensorflow as tf


def data(seed):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(64, 4)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]


class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(float(os.environ.get("KERAS_SEARCH_SLEEP", "0")))


def main(core_context, info):
    hparams = info.trial.hparams
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(hparams["arch"]["units"]),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(tf.keras.optimizers.SGD(hparams["lr"]), "mse")
    x, y = data(0)
    epochs_done = 0
    for op in core_context.searcher.operations():
        det_cb = det.keras.DeterminedCallback(
            core_context, checkpoint=info.latest_checkpoint, continue_id=info.trial.trial_id
        )
        history = model.fit(
            x,
            y,
            batch_size=16,
            initial_epoch=epochs_done,
            epochs=op.length,
            validation_data=data(1),
            callbacks=[det_cb, Slow()],
            verbose=0,
        )
        if core_context.preempt.should_preempt():
            return
        epochs_done = op.length
        op.report_completed(history.history["val_loss"][-1])
    print(f"TRAINED {epochs_done} EPOCHS")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None and info.task_type == "TRIAL", "run me as a trial"
    with det.core.init() as core_context:
        main(core_context, info)
