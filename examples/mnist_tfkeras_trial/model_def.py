"""The reference's TFKerasTrial MNIST tutorial on ckptstore, with 1797 synthetic 8x8 digits
(drawn from a 3x5 font at random places, with noise: no download) in place of MNIST, so the
example needs no dataset package.

Run it::

    ckptstore experiment create const.yaml .
    ckptstore experiment create search.yaml .      # random search over 4 trials
"""

import keras
import numpy as np

import ckptstore as det
from ckptstore.keras import InMemorySequence, TFKerasTrial

VALIDATION_RECORDS = 297
RECORDS = 1797
#: Digits 0-9 in a 3x5 font, one string per row.
GLYPHS = [
    ("###", "#.#", "#.#", "#.#", "###"),
    (".#.", "##.", ".#.", ".#.", "###"),
    ("###", "..#", "###", "#..", "###"),
    ("###", "..#", ".##", "..#", "###"),
    ("#.#", "#.#", "###", "..#", "..#"),
    ("###", "#..", "###", "..#", "###"),
    ("###", "#..", "###", "#.#", "###"),
    ("###", "..#", ".#.", ".#.", ".#."),
    ("###", "#.#", "###", "#.#", "###"),
    ("###", "#.#", "###", "..#", "###"),
]


def load_data():
    """((train_images, train_labels), (test_images, test_labels)) of 8x8 digits in [0, 1]:
    each glyph 5 rows by 3 (or, doubled, 6) columns at a random column (and one of two rows), plus noise; the same
    every run."""
    rng = np.random.default_rng(0)
    fonts = [np.array([[c == "#" for c in row] for row in g], dtype="float32") for g in GLYPHS]
    labels = rng.integers(0, 10, RECORDS)
    images = np.zeros((RECORDS, 8, 8), dtype="float32")
    for i, label in enumerate(labels):
        glyph = fonts[label]
        if rng.random() < 0.5:  # wide: every column doubled
            glyph = np.repeat(glyph, 2, axis=1)
        top = rng.integers(0, 2)
        left = rng.integers(0, 8 - glyph.shape[1] + 1)
        images[i, top : top + glyph.shape[0], left : left + glyph.shape[1]] = glyph
    images = np.clip(images + rng.normal(0.0, 0.15, images.shape), 0.0, 1.0).astype("float32")
    n = RECORDS - VALIDATION_RECORDS
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
