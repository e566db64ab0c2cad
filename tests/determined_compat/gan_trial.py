"""A GAN as a TFKerasTrial, in the shape of Determined's DCGAN example (our own code).

What it exercises: a dataset of images only (no targets), a subclassed ``keras.Model`` whose
``__init__`` takes its two sub-models (so it has no usable ``get_config``), a custom
``train_step`` / ``test_step``, and two optimizers wrapped with ``context.wrap_optimizer``
(generator's and discriminator's) while ``super().compile()`` leaves its own default optimizer
unused. Tiny: 8x8 grey images, a 4-number noise vector. Runs on Keras 3 and Keras 2 (whatever
``tf.keras`` is). ``SIGTERM_AT``: the batch after which a callback sends this process SIGTERM.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import tensorflow as tf

import ckptstore as det
from tests.keras_io.keras_under_test import keras

NOISE = 4
#: Set by a test: send SIGTERM to this process after this many batches (None: never).
SIGTERM_AT: dict = {"batch": None}


def make_generator():
    return keras.Sequential(
        [
            keras.Input((NOISE,)),
            keras.layers.Dense(16, use_bias=False),
            keras.layers.BatchNormalization(),
            keras.layers.LeakyReLU(),
            keras.layers.Reshape((4, 4, 1)),
            keras.layers.Conv2DTranspose(1, 3, strides=2, padding="same", activation="tanh"),
        ],
        name="generator",
    )


def make_discriminator():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, strides=2, padding="same"),
            keras.layers.LeakyReLU(),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ],
        name="discriminator",
    )


def _bce(labels, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


class TinyGan(keras.Model):
    """Takes its sub-models as arguments: Keras cannot rebuild it from a config."""

    def __init__(self, discriminator, generator, batch_size):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.batch_size = batch_size

    def compile(self, discriminator_optimizer, generator_optimizer):
        super().compile()  # Keras's default optimizer: never used by train_step
        self.discriminator_optimizer = discriminator_optimizer
        self.generator_optimizer = generator_optimizer

    def call(self, images, training=False):
        return self.discriminator(images, training=training)

    def _noise(self):
        # the global TF generator: seeded by the trial seed, restored on resume
        return tf.random.get_global_generator().normal([self.batch_size, NOISE])

    def train_step(self, images):
        if isinstance(images, tuple):  # (images,) from a (x,) loader
            images = images[0]
        noise = self._noise()
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = self.generator(noise, training=True)
            real_logits = self.discriminator(images, training=True)
            fake_logits = self.discriminator(fake, training=True)
            g_loss = _bce(tf.ones_like(fake_logits), fake_logits)
            d_loss = _bce(tf.ones_like(real_logits), real_logits) + _bce(
                tf.zeros_like(fake_logits), fake_logits
            )
        g_vars = self.generator.trainable_variables
        d_vars = self.discriminator.trainable_variables
        self.generator_optimizer.apply_gradients(
            zip(g_tape.gradient(g_loss, g_vars), g_vars, strict=True)
        )
        self.discriminator_optimizer.apply_gradients(
            zip(d_tape.gradient(d_loss, d_vars), d_vars, strict=True)
        )
        return {"d_loss": d_loss, "g_loss": g_loss}

    def test_step(self, images):
        if isinstance(images, tuple):
            images = images[0]
        fake = self.generator(self._noise(), training=False)
        real_logits = self.discriminator(images, training=False)
        fake_logits = self.discriminator(fake, training=False)
        d_loss = _bce(tf.ones_like(real_logits), real_logits) + _bce(
            tf.zeros_like(fake_logits), fake_logits
        )
        return {"d_loss": d_loss, "g_loss": _bce(tf.ones_like(fake_logits), fake_logits)}


def images(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (n, 8, 8, 1))).astype("float32")


class SigtermAfter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if SIGTERM_AT["batch"] is not None and self.seen == SIGTERM_AT["batch"]:
            os.kill(os.getpid(), signal.SIGTERM)


class GanTrial(det.keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        gan = TinyGan(
            make_discriminator(), make_generator(), self.context.get_per_slot_batch_size()
        )
        gan = self.context.wrap_model(gan)
        g_opt = self.context.wrap_optimizer(
            keras.optimizers.Adam(self.context.get_hparam("generator_lr"), beta_1=0.5)
        )
        d_opt = self.context.wrap_optimizer(
            keras.optimizers.Adam(self.context.get_hparam("discriminator_lr"), beta_1=0.5)
        )
        gan.compile(discriminator_optimizer=d_opt, generator_optimizer=g_opt)
        return gan

    def build_training_data_loader(self):
        data = self.context.get_data_config().get("train", "dataset")
        if data == "tuple1":  # an (x,) tuple of NumPy images
            return (images(48, 1),)
        ds = tf.data.Dataset.from_tensor_slices(images(48, 1))
        ds = self.context.wrap_dataset(ds)
        return ds.batch(self.context.get_per_slot_batch_size(), drop_remainder=True)

    def build_validation_data_loader(self):
        ds = tf.data.Dataset.from_tensor_slices(images(16, 2))
        return self.context.wrap_dataset(ds).batch(
            self.context.get_per_slot_batch_size(), drop_remainder=True
        )

    def keras_callbacks(self):
        return [SigtermAfter()]
