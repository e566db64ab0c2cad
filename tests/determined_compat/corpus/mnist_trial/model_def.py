"""A TFKerasTrial in the shape of Determined's mnist_tf_keras example, on small synthetic
"images" (8x8, ten classes told apart by which pixel is bright) so nothing is downloaded."""

import os
import time

import numpy as np
import tensorflow as tf
from determined import keras


def make_images(n, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n)
    images = rng.uniform(0.0, 0.3, size=(n, 8, 8)).astype("float32")
    images[np.arange(n), labels // 8 * 4, labels % 8] += 1.0
    return images, labels.astype("int64")


class MNISTTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context

    def build_model(self):
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(8, 8)),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(self.context.get_hparam("dense1"), activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model = self.context.wrap_model(model)
        optimizer = tf.keras.optimizers.SGD(learning_rate=self.context.get_hparam("learning_rate"))
        optimizer = self.context.wrap_optimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        return model

    def build_training_data_loader(self) -> keras.InputData:
        return make_images(512, seed=0)

    def build_validation_data_loader(self) -> keras.InputData:
        return make_images(128, seed=1)

    def keras_callbacks(self):
        pause = float(os.environ.get("MNIST_BATCH_PAUSE_S", "0"))
        if not pause:  # lets a test interrupt the run in the middle
            return []
        return [
            tf.keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs=None: time.sleep(pause)
            )
        ]
