"""Scripts of backend_shapes_worker.py that differ in their input: keras-io's tf.data pipelines
(augmentation layers in ``map()``, stateless augmentation, ``cache()`` + ``repeat()`` with
``steps_per_epoch``, ``TextVectorization``), a ``PyDataset`` that reorders itself, and an endless
generator.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tests.keras_io.backend_shapes_worker_base import (
    BATCH,
    N,
    Shape,
    classifier,
    dense_model,
    endless,
    numbers,
    small_images,
)


def shape_augmentation_in_tf_data() -> Shape:
    """The other keras-io way: the augmentation layers map a tf.data pipeline (they run on
    TensorFlow there, whatever the backend), the model trains on what it yields."""
    import tensorflow as tf

    x, y = small_images()
    flip, shift = keras.layers.RandomFlip("horizontal"), keras.layers.RandomTranslation(0.2, 0.2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=2).batch(BATCH)
    ds = ds.map(lambda images, labels: (shift(flip(images)), labels))
    return Shape(classifier(), (ds,), {"shuffle": False}, x)


def _convnet() -> Any:
    """mnist_convnet's model, tiny: Conv2D, MaxPooling2D, Flatten, Dropout, a softmax Dense."""
    layers = keras.layers
    model = keras.Sequential(
        [keras.Input((6, 6, 1)), layers.Conv2D(4, 3, activation="relu"), layers.MaxPooling2D()]
    )
    for layer in (layers.Flatten(), layers.Dropout(0.5), layers.Dense(3, activation="softmax")):
        model.add(layer)
    model.compile(
        keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def shape_tfdata_stateless_augment() -> Shape:
    """image_classification_from_scratch's pipeline (shuffle with a seed, batch, map with
    num_parallel_calls, prefetch; a tf.data validation set), one pass an epoch, its augmentation
    stateless and seeded from a counter zipped in (TensorFlow's augmentation guide's way)."""
    import tensorflow as tf

    def augment(batch: Any, count: Any) -> Any:
        images, labels = batch
        seed = tf.stack([count, tf.constant(7, tf.int64)])
        images = tf.image.stateless_random_flip_left_right(images, seed)
        return tf.image.stateless_random_brightness(images, 0.2, seed), labels

    x, y = small_images()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=5).batch(BATCH)
    ds = tf.data.Dataset.zip((ds, tf.data.experimental.Counter()))
    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val = tf.data.Dataset.from_tensor_slices(small_images()).batch(BATCH)
    return Shape(_convnet(), (ds,), {"validation_data": val}, x)


def shape_tfdata_cache_repeat_steps() -> Shape:
    """The tf.data guide's order (map, cache, shuffle with a seed, batch, repeat, prefetch) with
    steps_per_epoch=5 over passes of 4 batches: SIGTERM in epoch 2 reads from the cache
    filled in the first pass, a pass ending inside each epoch."""
    import tensorflow as tf

    x, y = numbers()
    ds = tf.data.Dataset.from_tensor_slices((x * 255.0, y)).map(lambda a, b: (a / 255.0, b))
    ds = ds.cache().shuffle(N, seed=6).batch(BATCH).repeat().prefetch(tf.data.AUTOTUNE)
    return Shape(dense_model(), (ds,), {"steps_per_epoch": 5}, x)


WORDS = "good great fine fun bad awful dull slow plot cast film the a".split()


def _reviews(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    texts = [" ".join(rng.choice(WORDS, rng.randint(3, 8))).title() + "!<br />" for _ in range(n)]
    score = [sum((w in WORDS[:4]) - (w in WORDS[4:8]) for w in t.lower().split()) for t in texts]
    return np.array(texts), (np.array(score) > 0).astype("float32")


def shape_text_vectorization_tfdata() -> Shape:
    """text_classification_from_scratch: TextVectorization adapted on the raw string dataset and
    mapped over it, then cache() and prefetch(); an Embedding + Conv1D model on the indices.
    (Its custom ``standardize`` function fails in dataset.map() on JAX and PyTorch with Keras
    3.15, with or without ckptstore, which hands it NumPy strings there: the default here.)"""
    import tensorflow as tf

    vectorize = keras.layers.TextVectorization(max_tokens=16, output_sequence_length=6)
    raw = tf.data.Dataset.from_tensor_slices(_reviews(N, 7)).shuffle(N, seed=8).batch(BATCH)
    vectorize.adapt(raw.map(lambda text, label: text))

    def indices(text: Any, label: Any) -> Any:
        return vectorize(tf.expand_dims(text, -1)), label

    train = raw.map(indices).cache().prefetch(10)
    val = tf.data.Dataset.from_tensor_slices(_reviews(8, 9)).batch(BATCH).map(indices)
    texts = tf.data.Dataset.from_tensor_slices(_reviews(N, 7)[0]).batch(N)
    sample = next(iter(texts.map(lambda t: vectorize(tf.expand_dims(t, -1))))).numpy()
    inputs = keras.Input((None,), dtype="int64")
    h = keras.layers.Dropout(0.5)(keras.layers.Embedding(16, 8)(inputs))
    h = keras.layers.Conv1D(4, 3, activation="relu")(h)
    h = keras.layers.Dense(4, activation="relu")(keras.layers.GlobalMaxPooling1D()(h))
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dropout(0.5)(h))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    return Shape(model, (train,), {"validation_data": val.cache()}, sample)


class EpochShuffled(keras.utils.PyDataset):
    """A PyDataset in keras-io's shape (batches indexed from arrays) that reorders its samples
    in on_epoch_end from its epoch count; get_state/load_state carry the count over a resume."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> None:
        super().__init__(workers=1, use_multiprocessing=False, **kwargs)
        self.x, self.y, self.epoch = x, y, 0
        self.order = np.arange(len(x))

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.order[i * BATCH : (i + 1) * BATCH]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self) -> None:
        self.load_state({"epoch": self.epoch + 1})

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.order = np.random.RandomState(self.epoch).permutation(len(self.x))


def shape_pydataset_workers_1() -> Shape:
    x, y = numbers()
    return Shape(dense_model(), (EpochShuffled(x, y),), {}, x)


def shape_generator_steps_per_epoch() -> Shape:
    """An endless seeded generator of shuffled batches with steps_per_epoch=3 (passes of 4)."""
    x, y = numbers()
    return Shape(dense_model(), (endless(x, y, 9),), {"steps_per_epoch": 3}, x, sigterm_at=4)


#: shape -> the backends it runs on
SHAPES = {
    "augmentation_in_tf_data": (shape_augmentation_in_tf_data, ("jax", "torch")),
    "tfdata_stateless_augment": (shape_tfdata_stateless_augment, ("jax", "torch")),
    "tfdata_cache_repeat_steps": (shape_tfdata_cache_repeat_steps, ("jax", "torch")),
    "text_vectorization_tfdata": (shape_text_vectorization_tfdata, ("jax", "torch")),
    "pydataset_workers_1": (shape_pydataset_workers_1, ("jax", "torch")),
    "generator_steps_per_epoch": (shape_generator_steps_per_epoch, ("jax", "torch")),
}
