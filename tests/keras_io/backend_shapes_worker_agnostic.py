"""keras-io's backend-agnostic scripts of backend_shapes_worker.py added in session 14, where
users of JAX and PyTorch go: a layer written with ``keras.ops`` only whose ``build()`` makes its
weights from the first batch's shape (a ``Sequential`` without an ``Input``: built by ``fit()``),
with ``validation_data`` as a ``PyDataset``; an ``Embedding`` (``mask_zero=True``) +
``GlobalAveragePooling1D`` model on padded integer sequences from a generator; the
``mixed_float16`` policy (``compile()`` wraps the optimizer in a ``LossScaleOptimizer``); and on
JAX ``compile(jit_compile=False)``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tests.keras_io.backend_shapes_worker_base import (
    ARRAYS,
    BATCH,
    N,
    Shape,
    compiled,
    dense_body,
    endless,
    numbers,
)


class GatedDense(keras.layers.Layer):
    """A gated linear unit in ``keras.ops`` only; ``build()`` sizes its kernel from the first
    input it sees."""

    def __init__(self, units: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], 2 * self.units), name="kernel")
        self.bias = self.add_weight(shape=(2 * self.units,), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        value, gate = keras.ops.split(keras.ops.matmul(inputs, self.kernel) + self.bias, 2, -1)
        return value * keras.ops.sigmoid(gate)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}


class Batches(keras.utils.PyDataset):
    """keras-io's ``Sequence`` shape, in order: batch ``i`` of the arrays."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.x, self.y = x, y

    def __len__(self) -> int:
        return -(-len(self.x) // BATCH)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[i * BATCH : (i + 1) * BATCH], self.y[i * BATCH : (i + 1) * BATCH]


def shape_ops_layer_lazy_build() -> Shape:
    """No ``Input``: fit() builds the layers on its first batch (in the resumed run too, before
    the checkpoint's weights go in); validated on a PyDataset every epoch."""
    x, y = numbers()
    layers = [GatedDense(8), keras.layers.Dropout(0.25), keras.layers.Dense(3)]
    model = compiled(keras.Sequential(layers))
    val = Batches(*numbers(seed=11))
    load = {"custom_objects": {"GatedDense": GatedDense}}
    return Shape(model, (x, y), {**ARRAYS, "validation_data": val}, x, load)


VOCABULARY = 20
LENGTH = 6


def sequences(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``N`` integer sequences of 2-6 tokens padded with 0 to ``LENGTH``; label: the parity of
    their sum."""
    rng = np.random.RandomState(seed)
    x = np.zeros((N, LENGTH), "int32")
    for row, length in enumerate(rng.randint(2, LENGTH + 1, N)):
        x[row, :length] = rng.randint(1, VOCABULARY, length)
    return x, (x.sum(axis=1) % 2).astype("int64")


def shape_embedding_pooling_generator() -> Shape:
    """An endless seeded generator of shuffled padded sequences, ``steps_per_epoch=4`` (one
    pass): ``Embedding(mask_zero=True)`` -> ``GlobalAveragePooling1D`` (masked) -> Dense."""
    x, y = sequences(12)
    inputs = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(inputs)
    h = keras.layers.Dropout(0.2)(keras.layers.GlobalAveragePooling1D()(h))
    model = compiled(keras.Model(inputs, keras.layers.Dense(2)(h)))
    return Shape(model, (endless(x, y, 13),), {"steps_per_epoch": 4}, x)


def shape_mixed_float16() -> Shape:
    """keras-io's mixed-precision recipe: the global ``mixed_float16`` policy while the model is
    built (float16 compute, float32 variables), the last activation in float32; ``compile()``
    wraps Adam in a ``LossScaleOptimizer`` (its dynamic scale is optimizer state)."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        x, y = numbers()
        inputs = keras.Input((4,))
        outputs = keras.layers.Activation("linear", dtype="float32")(dense_body(inputs))
        model = compiled(keras.Model(inputs, outputs))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    return Shape(model, (x, y), ARRAYS, x)


def shape_jax_no_jit() -> Shape:
    """``compile(jit_compile=False)`` on JAX: every step runs op by op, Dropout included."""
    x, y = numbers()
    inputs = keras.Input((4,))
    model = compiled(keras.Model(inputs, dense_body(inputs)), jit_compile=False)
    return Shape(model, (x, y), {**ARRAYS, "validation_data": numbers(seed=14)}, x)


#: shape -> the backends it runs on
SHAPES = {
    "ops_layer_lazy_build": (shape_ops_layer_lazy_build, ("jax", "torch")),
    "embedding_pooling_generator": (shape_embedding_pooling_generator, ("jax", "torch")),
    "mixed_float16": (shape_mixed_float16, ("jax", "torch")),
    "jax_no_jit": (shape_jax_no_jit, ("jax",)),
}
