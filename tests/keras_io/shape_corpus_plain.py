"""Shapes of the model-shape corpus built from Keras's own layers only (no class of the
training script), trained the default way: the corpus's data helpers, the model shapes
(Sequential, functional with dict inputs, nested, stateful RNN, augmentation layers) and the
round-3 input pipelines and adapted preprocessing. ``shape_corpus_worker.py`` runs them beside
its own (``SHAPES``); see its docstring. How a model is trained (fit() arguments, optimizers,
callbacks) is ``shape_corpus_training.py``'s subject.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tests.keras_io.keras_under_test import KERAS_MAJOR, keras
from tests.keras_io.shape_corpus_runner import BATCH, N

WORDS = np.array(["red", "green", "blue", "cyan", "grey"])


# ---- data -------------------------------------------------------------------------------------
def numbers(features=4, classes=3):
    rng = np.random.RandomState(0)
    x = rng.rand(N, features).astype("float32")
    y = (x.sum(axis=1) * 2.3).astype("int64") % classes
    return x, y


def compiled(model, **kwargs):
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **kwargs,
    )
    return model


def images(size=8):
    rng = np.random.RandomState(2)
    x = (rng.rand(N, size, size, 3) * 255).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) / 8).astype("int64") % 3
    return x, y


# ---- model shapes -----------------------------------------------------------------------------
def shape_sequential():
    x, y = numbers()
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    return compiled(model, metrics=["accuracy"]), (x, y), {"shuffle": True}, x, {}


def shape_functional_dict():
    x, y = numbers(3)
    words = WORDS[np.arange(N) % len(WORDS)].reshape(-1, 1)
    lookup = keras.layers.StringLookup(output_mode="multi_hot")
    lookup.adapt(words)
    norm = keras.layers.Normalization()
    norm.adapt(x)
    num_in = keras.Input((3,), name="num")
    word_in = keras.Input((1,), dtype="string", name="word")
    h = keras.layers.Concatenate()([norm(num_in), lookup(word_in)])
    out = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(h))
    model = compiled(keras.Model({"num": num_in, "word": word_in}, out))
    inputs = {"num": x, "word": words}
    ds = tf.data.Dataset.from_tensor_slices((inputs, y)).shuffle(N, seed=2).batch(BATCH)
    return model, (ds,), {}, inputs, {}


def shape_nested():
    x, y = numbers()
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu")])
    inp = keras.Input((4,))
    model = compiled(keras.Model(inp, keras.layers.Dense(3)(inner(inp))))
    return model, (x, y), {}, x, {}


def shape_batchnorm():
    x, y = numbers()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization()]
        + [keras.layers.Dense(3)]
    )
    return compiled(model), (x, y), {"shuffle": True}, x, {}


def shape_stateful_rnn():
    rng = np.random.RandomState(1)
    x = rng.rand(N, 5, 2).astype("float32")
    y = (x.sum(axis=(1, 2)) * 3).astype("int64") % 3
    model = keras.Sequential(
        [keras.Input(batch_shape=(BATCH, 5, 2)), keras.layers.LSTM(4, stateful=True)]
        + [keras.layers.Dense(3)]
    )
    return compiled(model), (x, y), {"shuffle": False}, x, {}


def shape_augmentation_layers():
    """Image classification from scratch: random augmentation layers inside the model (each
    draws from its own seed state in training, and is the identity in predict)."""
    x, y = images()
    augment = keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomRotation(0.1),
            keras.layers.RandomZoom(0.1),
        ]
    )
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Rescaling(1.0 / 255)(augment(inp))
    h = keras.layers.Conv2D(4, 3, activation="relu")(h)
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
    return compiled(keras.Model(inp, out)), (x, y), {"shuffle": True}, x, {}


# ---- round 3: input pipelines and adapted preprocessing, Keras layers only --------------
def _png_folder():
    """Class folders of small PNG files (written once, the same in every phase)."""
    folder = os.path.abspath(os.path.join("shape-data", "images"))
    x, y = images()
    for i, (image, label) in enumerate(zip(x.astype("uint8"), y, strict=True)):
        path = os.path.join(folder, f"class_{label}", f"{i:02d}.png")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tf.io.write_file(path, tf.io.encode_png(image))
    return folder


def shape_image_directory():
    """``image_dataset_from_directory`` over PNG files: file reads, decoding, a seeded shuffle."""
    folder = _png_folder()
    ds = (
        keras.utils.image_dataset_from_directory(
            folder, image_size=(8, 8), batch_size=BATCH, shuffle=True, seed=9, verbose=False
        )
        if KERAS_MAJOR == 3
        else keras.utils.image_dataset_from_directory(
            folder, image_size=(8, 8), batch_size=BATCH, shuffle=True, seed=9
        )
    )
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu")(keras.layers.Rescaling(1 / 255)(inp))
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
    x, _ = images()
    return compiled(keras.Model(inp, out)), (ds,), {}, x.astype("uint8").astype("float32"), {}


def shape_timeseries_forecast():
    """``timeseries_dataset_from_array`` windows (shuffled, seeded) forecasting a value ahead."""
    length, ahead = 5, 2
    t = np.arange(N + length + ahead - 1, dtype="float32")  # N windows
    series = np.stack([np.sin(t / 3), np.cos(t / 5)], axis=1).astype("float32")
    inputs, targets = series[:-ahead], series[length + ahead - 1 :, :1]
    ds = keras.utils.timeseries_dataset_from_array(
        inputs, targets, sequence_length=length, batch_size=BATCH, shuffle=True, seed=10
    )
    model = keras.Sequential(
        [keras.Input((length, 2)), keras.layers.LSTM(4), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(0.01), loss="mse")
    sample = np.stack([inputs[i : i + length] for i in range(N)])
    return model, (ds,), {}, sample, {}


def shape_masked_lookup_lstm():
    """Adapted vocabularies in the model: ``TextVectorization`` padding texts of different
    lengths, ``Embedding(mask_zero=True)`` and an ``LSTM`` reading the mask, an
    ``IntegerLookup`` one-hot feature beside it."""
    texts = np.array(
        [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 4)) for i in range(N)]
    )
    codes = (np.arange(N) * 7 % 5 + 10).astype("int64")
    labels = (np.arange(N) % 2).astype("int64")
    vectorize = keras.layers.TextVectorization(max_tokens=8, output_sequence_length=5)
    vectorize.adapt(texts)
    lookup = keras.layers.IntegerLookup(output_mode="one_hot")
    lookup.adapt(codes)
    text_in = keras.Input((1,), dtype="string", name="text")
    code_in = keras.Input((1,), dtype="int64", name="code")
    ids = vectorize(keras.layers.Reshape(())(text_in) if KERAS_MAJOR == 3 else text_in)
    h = keras.layers.LSTM(4)(keras.layers.Embedding(8, 4, mask_zero=True)(ids))
    onehot = lookup(keras.layers.Reshape(())(code_in) if KERAS_MAJOR == 3 else code_in)
    out = keras.layers.Dense(2)(keras.layers.Concatenate()([h, onehot]))
    model = compiled(keras.Model({"text": text_in, "code": code_in}, out))
    inputs = {"text": texts.reshape(-1, 1), "code": codes.reshape(-1, 1)}
    ds = tf.data.Dataset.from_tensor_slices((inputs, labels)).shuffle(N, seed=11).batch(BATCH)
    return model, (ds,), {}, inputs, {}


SHAPES = {
    name.removeprefix("shape_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("shape_")
}
