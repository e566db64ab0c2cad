"""What every family of ``backend_shapes_worker.py``'s scripts shares: the batch and epoch sizes,
small seeded data, a dense body, :class:`Shape` (a model and how ``fit()`` trains it), and the
sharding probe's record. No shapes in here; the families are ``backend_shapes_worker_steps.py``
(train steps of the backend's own style, distribution, a GAN), ``_data.py`` (tf.data pipelines,
TextVectorization, a PyDataset, a generator), ``_script.py`` (layers, metrics, losses and
callbacks of the script) and ``_agnostic.py`` (keras-io's backend-agnostic scripts added in
session 14: a ``keras.ops`` layer built lazily, integer sequences, a VAE, mixed precision).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import keras
import numpy as np

BACKEND = keras.backend.backend()
BATCH = 4
STEPS = 4  # per epoch
EPOCHS = 2
N = BATCH * STEPS
SIGTERM_AT = 6  # inside epoch 2 (and between two updates of the accumulating optimizer)


def numbers(features: int = 4, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    x = rng.rand(N, features).astype("float32")
    return x, (x.sum(axis=1) * 2.3).astype("int64") % classes


def dense_body(inputs: Any) -> Any:
    """Dense -> Dropout (its SeedGenerator state moves every step) -> Dense logits."""
    h = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.layers.Dense(3)(keras.layers.Dropout(0.25)(h))


@dataclasses.dataclass
class Shape:
    """A model and how fit() trains it, what it predicts on, how it loads."""

    model: Any
    data: tuple[Any, ...]
    fit: dict[str, Any] = dataclasses.field(default_factory=dict)
    sample: Any = None
    load: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: entered around building, training and loading (a keras.distribution scope)
    scope: Any = contextlib.nullcontext
    #: SIGTERM after this many batch-end calls of the run (one per execution)
    sigterm_at: int = SIGTERM_AT
    epochs: int = EPOCHS
    #: the script's own callbacks (given the shape's folder), listed before DeterminedCallback
    callbacks: Any = lambda folder: []


ARRAYS = {"batch_size": BATCH, "shuffle": True}


def compiled(model: Any, optimizer: Any = None, **options: Any) -> Any:
    """``model`` compiled for its 3 logits (Adam(0.01) by default; ``options``: compile()'s)."""
    model.compile(
        optimizer or keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **options,
    )
    return model


def endless(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    """An endless generator of batches, each pass over ``x, y`` in a new seeded order."""
    rng = np.random.RandomState(seed)
    while True:
        order = rng.permutation(N)
        for i in range(0, N, BATCH):
            yield x[order[i : i + BATCH]], y[order[i : i + BATCH]]


#: The sharding of the input batch of every train step JAX compiled in this run.
BATCH_SPECS: list[str] = []


def small_images() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    x = rng.rand(N, 6, 6, 1).astype("float32")
    return x, (x.mean(axis=(1, 2, 3)) * 9).astype("int64") % 3


def classifier(*front: Any) -> Any:
    layers = [keras.layers.Conv2D(2, 3), keras.layers.GlobalAveragePooling2D()]
    model = keras.Sequential([keras.Input((6, 6, 1)), *front, *layers, keras.layers.Dense(3)])
    return compiled(model)


def dense_model(optimizer: Any = None) -> Any:
    inputs = keras.Input((4,))
    return compiled(keras.Model(inputs, dense_body(inputs)), optimizer)
