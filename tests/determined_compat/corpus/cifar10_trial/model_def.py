"""A TFKerasTrial in the shape of Determined's cifar10_tf_keras example (``model_def:CIFARTrial``,
a small conv net, ``context.wrap_dataset`` + ``get_per_slot_batch_size``) on tiny random
"images" (8x8x3, four classes told apart by which channel is bright) so nothing is downloaded.
Hyperparameter ``data: sequence`` trains on a ``keras.utils.Sequence`` of per-slot batches
instead (the older example's ``ImageDataGenerator.flow``)."""

import os
import time

import numpy as np
import tensorflow as tf
from determined import keras


def make_images(n, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 4, size=n)
    images = rng.uniform(0.0, 0.3, size=(n, 8, 8, 3)).astype("float32")
    images[np.arange(n), :, :, labels % 3] += (0.5 + 0.25 * (labels // 3))[:, None, None]
    return images, labels.astype("int64")


class Batches(tf.keras.utils.Sequence):
    """The images in per-slot batches, a ``keras.utils.Sequence`` (hparam ``data: sequence``):
    each worker of a trial on several slots reads its share of the batch indices."""

    def __init__(self, images, labels, batch_size):
        super().__init__()
        self.images, self.labels, self.batch_size = images, labels, batch_size

    def __len__(self):
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, i):
        part = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.images[part], self.labels[part]


class CIFARTrial(keras.TFKerasTrial):
    def __init__(self, context: keras.TFKerasTrialContext) -> None:
        self.context = context
        # As the example's load_numpy_data: local rank 0 fetches, the others wait for it.
        if self.context.distributed.get_local_rank() == 0:
            make_images(1, seed=0)
        self.context.distributed.allgather_local(None)
        self.train_np, self.test_np = make_images(64, seed=0), make_images(20, seed=1)

    def build_model(self):
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(8, 8, 3)),
                tf.keras.layers.Conv2D(4, 3, activation="relu"),
                tf.keras.layers.Dropout(self.context.get_hparam("layer1_dropout")),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(4),
            ]
        )
        model = self.context.wrap_model(model)
        optimizer = tf.keras.optimizers.Adam(self.context.get_hparam("learning_rate"))
        optimizer = self.context.wrap_optimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="categorical_accuracy")],
        )
        return model

    def keras_callbacks(self):
        pause = float(os.environ.get("CIFAR_BATCH_PAUSE_S", "0"))
        if not pause:  # lets a test interrupt the run in the middle
            return []
        return [
            tf.keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda batch, logs=None: time.sleep(pause)
            )
        ]

    def build_training_data_loader(self) -> keras.InputData:
        if self.context.get_hparams().get("data") == "sequence":  # as ImageDataGenerator.flow
            return Batches(*self.train_np, self.context.get_per_slot_batch_size())
        train_ds = self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices(self.train_np))
        return train_ds.batch(self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> keras.InputData:
        test_ds = self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices(self.test_np))
        return test_ds.batch(1)
