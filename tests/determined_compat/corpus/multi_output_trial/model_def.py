"""A two-input, two-output TFKerasTrial in the shape Determined 0.38.1's Keras examples are
written in: a functional ``Model`` wrapped with ``context.wrap_model``, its optimizer with
``context.wrap_optimizer``, sizes read from ``context.get_data_config()``,
``keras.callbacks.TensorBoard(update_freq="batch", profile_batch=0, histogram_freq=1)`` next to
a plain Keras callback, loaders annotated ``-> keras.InputData`` that return NumPy ``(x, y)``
where ``x`` and ``y`` are dicts of arrays keyed by the model's input and output names (the first
data type of Determined's TFKerasTrial). The data are generated here; nothing is downloaded.
"""

import os
import time

import numpy as np
import tensorflow as tf
from determined import keras
from tensorflow.keras import layers, losses, metrics, models, optimizers

NUM_CLASSES = 3


class PauseAfterBatch(tf.keras.callbacks.Callback):
    """Sleeps after each batch when MULTI_OUTPUT_BATCH_PAUSE_S is set (a test interrupts the
    run between checkpoints)."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(float(os.environ.get("MULTI_OUTPUT_BATCH_PAUSE_S", "0")))


def make_records(n, seed):
    """Species from measurements (a class) and a size (a number) to predict from them."""
    rng = np.random.RandomState(seed)
    species = rng.randint(0, NUM_CLASSES, size=n)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.5, 2.0]])
    measurements = (centers[species] + rng.normal(scale=0.3, size=(n, 4))).astype("float32")
    site = rng.normal(size=(n, 2)).astype("float32")
    size = (measurements[:, :1] * 0.5 + site[:, :1]).astype("float32")
    x = {"measurements": measurements, "site": site}
    y = {"species": species.astype("int64"), "size": size}
    return x, y


class MultiOutputTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context

    def build_model(self) -> models.Model:
        measurements = layers.Input(shape=(4,), name="measurements")
        site = layers.Input(shape=(2,), name="site")
        hidden = layers.Concatenate()([measurements, site])
        hidden = layers.Dense(self.context.get_hparam("hidden"), activation="relu")(hidden)
        species = layers.Dense(NUM_CLASSES, name="species")(hidden)
        size = layers.Dense(1, name="size")(hidden)
        model = models.Model(
            inputs={"measurements": measurements, "site": site},
            outputs={"species": species, "size": size},
        )
        model = self.context.wrap_model(model)

        optimizer = optimizers.Adam(
            learning_rate=self.context.get_hparam("learning_rate"),
            beta_1=self.context.get_hparam("beta_1"),
        )
        optimizer = self.context.wrap_optimizer(optimizer)

        model.compile(
            optimizer=optimizer,
            loss={
                "species": losses.SparseCategoricalCrossentropy(from_logits=True),
                "size": losses.MeanSquaredError(),
            },
            loss_weights={"species": 1.0, "size": self.context.get_hparam("size_weight")},
            metrics={
                "species": [metrics.SparseCategoricalAccuracy(name="accuracy")],
                "size": [metrics.MeanAbsoluteError(name="mae")],
            },
        )
        return model

    def keras_callbacks(self) -> list[tf.keras.callbacks.Callback]:
        return [
            keras.callbacks.TensorBoard(update_freq="batch", profile_batch=0, histogram_freq=1),
            PauseAfterBatch(),
        ]

    def build_training_data_loader(self) -> keras.InputData:
        data = self.context.get_data_config()
        return make_records(data["train_records"], seed=data["seed"])

    def build_validation_data_loader(self) -> keras.InputData:
        data = self.context.get_data_config()
        return make_records(data["validation_records"], seed=data["seed"] + 1)
