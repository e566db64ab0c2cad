"""Scripts of backend_shapes_worker.py with objects of the script in the model or the ``fit()``
call: augmentation layers (their ``SeedGenerator`` states), a layer, a metric and a loss
function of the script, and keras-io's ``ModelCheckpoint`` + ``ReduceLROnPlateau`` +
``EarlyStopping`` callbacks.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from tests.keras_io.backend_shapes_worker_base import (
    ARRAYS,
    Shape,
    classifier,
    dense_model,
    numbers,
    small_images,
)


def shape_augmentation() -> Shape:
    """Augmentation layers in the model (keras-io's image classifiers): each draws from its
    SeedGenerator, whose state is no weight of the .keras format."""
    x, y = small_images()
    augment = [
        keras.layers.RandomFlip("horizontal"),
        keras.layers.RandomBrightness(0.2, value_range=(0.0, 1.0)),
        keras.layers.RandomContrast(0.3),
    ]
    return Shape(classifier(*augment), (x, y), ARRAYS, x)


class ScaledDense(keras.layers.Layer):
    """A layer of the script: its own weights, an argument get_config() records."""

    def __init__(self, units: int, scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.scale = units, scale

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        return keras.ops.relu(keras.ops.matmul(inputs, self.kernel) * self.scale + self.bias)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "scale": self.scale}


class TrueClassProbability(keras.metrics.Metric):
    """A metric of the script with its own state: the mean probability of the true class."""

    def __init__(self, name: str = "true_p", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        rows = keras.ops.cast(keras.ops.reshape(y_true, (-1, 1)), "int32")
        p = keras.ops.take_along_axis(y_pred, rows, axis=1)
        self.total.assign_add(keras.ops.sum(p))
        self.count.assign_add(keras.ops.sum(keras.ops.ones_like(p)))

    def result(self) -> Any:
        return self.total / keras.ops.maximum(self.count, 1.0)


def smoothed_crossentropy(y_true: Any, y_pred: Any) -> Any:
    """A loss function of the script, given to compile() as the object."""
    rows = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
    return keras.losses.categorical_crossentropy(keras.ops.one_hot(rows, 3) * 0.9 + 0.1 / 3, y_pred)


def shape_script_objects() -> Shape:
    """A layer, a metric and a loss function defined in the script, BatchNormalization and
    Dropout (its SeedGenerator) in the model; loaded with custom_objects."""
    x, y = numbers()
    inputs = keras.Input((4,))
    h = keras.layers.BatchNormalization()(ScaledDense(8, scale=0.5)(inputs))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dropout(0.3)(h))
    model = keras.Model(inputs, outputs)
    metrics = [TrueClassProbability(), "accuracy"]
    model.compile(keras.optimizers.Adam(0.01), loss=smoothed_crossentropy, metrics=metrics)
    objects = (ScaledDense, TrueClassProbability, smoothed_crossentropy)
    load = {"custom_objects": {o.__name__: o for o in objects}}
    return Shape(model, (x, y), {**ARRAYS, "validation_data": numbers()}, x, load)


def keras_io_callbacks(folder: str) -> list[Any]:
    """timeseries_classification_from_scratch's callbacks (ModelCheckpoint of the best,
    ReduceLROnPlateau, EarlyStopping), EarlyStopping restoring the best weights. Their
    ``min_delta`` makes every epoch after the first one count as no better, whatever the
    backend's numbers: the rate halves after epochs 2 and 3, EarlyStopping stops after epoch 3
    (``baseline`` keeps epoch 1 from resetting its wait) and puts epoch 1's weights back."""
    path = os.path.join(folder, "best_model.keras")
    plateau = {"monitor": "val_loss", "min_delta": 10.0}
    return [
        keras.callbacks.ModelCheckpoint(path, save_best_only=True, monitor="val_loss"),
        keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=1, **plateau),
        keras.callbacks.EarlyStopping(
            patience=3, baseline=-1.0, restore_best_weights=True, **plateau
        ),
    ]


def shape_keras_callbacks() -> Shape:
    """4 epochs with keras-io's callbacks (listed before DeterminedCallback); SIGTERM in epoch
    3, between the two learning-rate cuts."""
    model = dense_model(keras.optimizers.Adam(0.05))
    fit = {**ARRAYS, "validation_data": numbers()}
    x = fit["validation_data"][0]
    return Shape(model, numbers(), fit, x, epochs=4, sigterm_at=10, callbacks=keras_io_callbacks)


#: shape -> the backends it runs on
SHAPES = {
    "augmentation": (shape_augmentation, ("jax", "torch")),
    "script_objects": (shape_script_objects, ("jax", "torch")),
    "keras_callbacks": (shape_keras_callbacks, ("jax", "torch")),
}
