"""An iris-shaped classifier trained with Determined's Core API and Keras callback.

Written after the shape of Determined 0.38.1's iris_tf_keras/train.py; the data are generated
here (three separable clusters), so nothing is downloaded.
"""

import argparse
import logging
import os
import time

import determined as det
import determined.keras
import numpy as np
from tensorflow.keras import callbacks, layers, losses, metrics, models, optimizers, utils

NUM_CLASSES = 3


def make_data(n, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, NUM_CLASSES, size=n)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.5, 2.0]])
    features = centers[labels] + rng.normal(scale=0.3, size=(n, 4))
    return features.astype("float32"), utils.to_categorical(labels, NUM_CLASSES)


def main(core_context, strategy, checkpoint, continue_id, hparams, epochs):
    # Each trial draws its initial weights the same way on every run, so a search's pruning
    # decisions (which compare trials' metrics) are the same on every run too.
    utils.set_random_seed(continue_id if isinstance(continue_id, int) else 0)
    train_x, train_y = make_data(240, seed=0)
    validation_data = make_data(60, seed=1)

    with strategy.scope():
        inputs = layers.Input(shape=(4,))
        hidden = layers.Dense(hparams["layer1_dense_size"], activation="relu")(inputs)
        outputs = layers.Dense(NUM_CLASSES, activation="softmax")(hidden)
        model = models.Model(inputs=inputs, outputs=outputs)
        model.compile(
            optimizers.RMSprop(learning_rate=hparams["learning_rate"]),
            losses.categorical_crossentropy,
            metrics=[metrics.categorical_accuracy],
        )

    det_cb = det.keras.DeterminedCallback(
        core_context, checkpoint=checkpoint, continue_id=continue_id, checkpoint_epochs=1
    )
    extra = []
    pause = float(os.environ.get("IRIS_EPOCH_PAUSE_S", "0"))
    if pause:  # lets a test interrupt the run between checkpoints
        extra.append(callbacks.LambdaCallback(on_epoch_end=lambda *_: time.sleep(pause)))

    model.fit(
        x=train_x,
        y=train_y,
        batch_size=hparams["global_batch_size"],
        validation_data=validation_data,
        epochs=epochs,
        callbacks=[det_cb, *extra],
        verbose=0,
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=500, help="how long to train for")
    args = parser.parse_args()

    info = det.get_cluster_info()
    if info and info.task_type == "TRIAL":
        continue_id = info.trial.trial_id
        checkpoint = info.latest_checkpoint
        hparams = info.trial.hparams
    else:
        continue_id = "local-train-task"
        checkpoint = None
        hparams = {"learning_rate": 1.0e-2, "layer1_dense_size": 16, "global_batch_size": 16}

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, strategy, checkpoint, continue_id, hparams, args.epochs)
