"""The reference's TFKerasTrial MNIST tutorial on ckptstore, with scikit-learn's bundled 8x8
digits (1797 images, no download) in place of MNIST.

Run it::

    ckptstore experiment create const.yaml .
    ckptstore experiment create search.yaml .      # random search over 4 trials
"""

import keras
import numpy as np
from sklearn.datasets import load_digits

import ckptstore as det
from ckptstore.keras import InMemorySequence, TFKerasTrial

VALIDATION_RECORDS = 297


def load_data():
    """((train_images, train_labels), (test_images, test_labels)) of 8x8 digits in [0, 1]."""
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")
    labels = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    n = len(images) - VALIDATION_RECORDS
    return (images[:n], labels[:n]), (images[n:], labels[n:])


class MNISTTrial(TFKerasTrial):
    def __init__(self, context: det.keras.TFKerasTrialContext):
        # required: store TFKerasTrialContext for later use
        self.context = context

    def build_model(self):
        model = keras.Sequential(
            [
                keras.Input(shape=(8, 8)),
                keras.layers.Flatten(),
                keras.layers.Dense(self.context.get_hparam("dense_units"), activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model = self.context.wrap_model(model)
        optimizer = self.context.wrap_optimizer(
            keras.optimizers.Adam(learning_rate=self.context.get_hparam("learning_rate"))
        )
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        return model

    def build_training_data_loader(self):
        (train_images, train_labels), _ = load_data()
        global_batch_size = self.context.get_hparam("global_batch_size")
        return InMemorySequence(
            data=train_images, labels=train_labels, batch_size=global_batch_size
        )

    def build_validation_data_loader(self):
        _, (test_images, test_labels) = load_data()
        batch_size = self.context.get_per_slot_batch_size()
        return InMemorySequence(data=test_images, labels=test_labels, batch_size=batch_size)
