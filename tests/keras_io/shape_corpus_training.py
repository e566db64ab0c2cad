"""Shapes of the model-shape corpus whose subject is how a model is trained, not the model:
``fit()`` arguments (sample and class weights, a generator with ``steps_per_epoch``),
``compile()`` and optimizer settings (mixed precision and loss scaling, gradient accumulation,
``steps_per_execution``, a schedule object, EMA) and callbacks beside ``DeterminedCallback``.
Keras layers only (no class of the training script); ``shape_corpus_worker.py`` runs them
beside its own (``SHAPES``); see its docstring.
"""

from __future__ import annotations

import os

import numpy as np

from tests.keras_io import shape_corpus_runner as runner
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


# ---- round 4: fit() arguments, outputs, XLA, loss scaling and callbacks real scripts use -------
def shape_loss_scale_growth():
    """``mixed_float16`` with an explicit ``LossScaleOptimizer(dynamic_growth_steps=3)`` and
    targets large enough that float16 gradients overflow at the default scale: steps 1-3 are
    skipped (the scale halves each time), 4-5 apply, the scale doubles at step 6 (where the
    SIGTERM lands) and step 7 overflows again. The scale, its good-step counter and the inner
    optimizer's iterations (4 of 8 steps applied) must all resume exactly."""
    x, y = numbers()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3, dtype="float32")]
        )
        optimizer = keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), dynamic_growth_steps=3
        )
        model.compile(optimizer, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    target = keras.utils.to_categorical(y, 3).astype("float32") * 30
    return model, (x, target), {"shuffle": True}, x, {}


def shape_fit_arguments():
    """``fit()`` arguments the corpus's other shapes leave at their defaults:
    ``validation_split`` with ``shuffle=True`` (the held-out tail is cut before the shuffle),
    a user-set ``initial_epoch=1`` of ``epochs=3`` and ``validation_freq=2``."""
    rng = np.random.RandomState(12)
    x = rng.rand(N + BATCH, 4).astype("float32")  # 4 steps of training after the 20% split
    y = (x.sum(axis=1) * 2.3).astype("int64") % 3
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    fit = {"validation_split": 0.2, "shuffle": True, "initial_epoch": 1, "epochs": 3}
    return compiled(model, metrics=["accuracy"]), (x, y), {**fit, "validation_freq": 2}, x, {}


def joined_outputs(model, sample):
    """One array of a multi-output model's predictions (outputs side by side, by name)."""
    out = model.predict(sample, batch_size=BATCH, verbose=0)
    parts = [out[k] for k in sorted(out)] if isinstance(out, dict) else list(out)
    return np.concatenate([np.asarray(p) for p in parts], axis=1)


def shape_multi_output():
    """The functional API guide's multi-output shape: two named heads, losses, ``loss_weights``
    and metrics given as dicts keyed by output name, targets as a dict."""
    x, y = numbers()
    inp = keras.Input((4,), name="features")
    h = keras.layers.Dense(6, activation="relu")(inp)
    kind = keras.layers.Dense(3, name="kind")(h)
    size = keras.layers.Dense(1, name="size")(h)
    model = keras.Model(inp, [kind, size])
    model.compile(
        keras.optimizers.Adam(0.01),
        loss={"kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "size": "mse"},
        loss_weights={"kind": 1.0, "size": 0.25},
        metrics={"kind": ["accuracy"], "size": [keras.metrics.MeanAbsoluteError()]},
    )
    targets = {"kind": y, "size": x.sum(axis=1, keepdims=True)}
    return model, (x, targets), {"shuffle": True}, x, {"predict": joined_outputs}


def shape_jit_compile():
    """``compile(jit_compile=True)``: the train step runs as one XLA program, dropout's random
    state inside it. Keras 3 turns ``jit_compile=True`` off (with a warning) when it compiles a
    model under TensorFlow's op determinism, as the corpus runs: the model is compiled, and
    loaded by UUID to predict, without it, as a script that does not enable it does."""
    x, y = numbers()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.2)]
        + [keras.layers.Dense(3)]
    )
    with runner.without_op_determinism():
        model = compiled(model, jit_compile=True)
    return model, (x, y), {"shuffle": True}, x, {"op_determinism": False}


def user_callbacks_dir(phase):
    """Where ``user_callbacks`` writes: the preempted and the resumed run share one folder, as a
    script run twice with the same paths does; the uninterrupted run has its own."""
    return os.path.join("user-callbacks", "straight" if phase == "straight" else "run")


def shape_user_callbacks():
    """Keras callbacks users put beside ``DeterminedCallback``: ``CSVLogger(append=True)``,
    ``TensorBoard(log_dir)``, ``TerminateOnNaN`` and a ``BackupAndRestore`` of their own (which
    ``fit()`` warns about: ckptstore restores, BackupAndRestore finds nothing after a
    preemption, see the page)."""
    x, y = numbers()
    folder = user_callbacks_dir(runner.PHASE)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    callbacks = [
        keras.callbacks.CSVLogger(os.path.join(folder, "log.csv"), append=True),
        keras.callbacks.TensorBoard(log_dir=os.path.join(folder, "tensorboard")),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.BackupAndRestore(os.path.join(folder, "backup")),
    ]
    fit = {"shuffle": True, "validation_data": (x[:8], y[:8]), "callbacks": callbacks}
    return compiled(model), (x, y), fit, x, {}


SHAPES = {
    name.removeprefix("shape_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("shape_")
}
