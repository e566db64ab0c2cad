"""Shapes of the model-shape corpus whose subject is how a model is trained, not the model:
``fit()`` arguments (sample and class weights, a generator with ``steps_per_epoch``),
``compile()`` and optimizer settings (mixed precision and loss scaling, gradient accumulation,
``steps_per_execution``, a schedule object, EMA) and callbacks beside ``DeterminedCallback``.
Keras layers only (no class of the training script); ``shape_corpus_worker.py`` runs them
beside its own (``SHAPES``); see its docstring.
"""

from __future__ import annotations

import numpy as np

from tests.keras_io.keras_under_test import keras
from tests.keras_io.shape_corpus_plain import compiled, numbers
from tests.keras_io.shape_corpus_runner import BATCH, STEPS, N


def shape_sample_weight():
    x, y = numbers()
    w = np.linspace(0.5, 1.5, N).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (x, y), {"sample_weight": w}, x, {}


def shape_class_weight():
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (x, y), {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}}, x, {}


def shape_mixed_precision():
    x, y = numbers()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(3, dtype="float32"),
            ]
        )
        model = compiled(model)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, (x, y), {}, x, {}


def shape_endless_generator():
    x, y = numbers()

    def batches():
        while True:  # one pass per epoch: steps_per_epoch == STEPS
            for i in range(0, N, BATCH):
                yield x[i : i + BATCH], y[i : i + BATCH]

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (batches(),), {"steps_per_epoch": STEPS}, x, {}


def shape_gradient_accumulation():
    """``gradient_accumulation_steps=4``: SIGTERM after step 6 lands between two updates, with
    2 gradients in the accumulators (optimizer variables)."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    model.compile(
        keras.optimizers.Adam(0.01, gradient_accumulation_steps=4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, (x, y), {"shuffle": True}, x, {}


def shape_steps_per_execution():
    """``compile(steps_per_execution=2)``: callbacks see every 2nd batch."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    return compiled(model, steps_per_execution=2), (x, y), {"shuffle": True}, x, {}


def shape_lr_schedule_ema():
    """A ``LearningRateSchedule`` object as the learning rate, and ``use_ema=True``."""
    x, y = numbers()
    decay = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=3, decay_rate=0.5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    model.compile(
        keras.optimizers.Adam(decay, use_ema=True, ema_momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, (x, y), {"shuffle": True}, x, {}


def halve_after_first(epoch, lr):
    """A LearningRateScheduler schedule of the keras docs' kind: from the current rate."""
    return lr if epoch < 1 else lr * 0.5


def shape_lr_scheduler_callback():
    """``LearningRateScheduler`` changing the rate (from its current value) at epoch begin."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    schedule = keras.callbacks.LearningRateScheduler(halve_after_first)
    return compiled(model), (x, y), {"shuffle": True, "callbacks": [schedule]}, x, {}


SHAPES = {
    name.removeprefix("shape_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("shape_")
}
