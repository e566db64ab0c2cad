"""Determined checkpoints written by real Keras 2 (``tf_keras``), the way Determined wrote them.

Each fixture trains a tiny ``tf_keras`` model a few steps (so optimizer slots are non-zero) and
saves it exactly as Determined's code did:

- ``DeterminedCallback``: ``model.save_weights(<dir>/model_checkpoint)`` (TF format, with the
  optimizer, since the compiled model tracks it);
- ``TFKerasTrial``: ``model.save_weights(<dir>/determined-keras-model-weights, save_format="tf")``
  and ``determined-keras-optimizer-weights.h5`` with one ``optimizer-N`` group per optimizer,
  each written by Keras' own ``save_optimizer_weights_to_hdf5_group``;
- older ``TFKerasTrial``: ``model.save(<dir>/determined-keras-model.h5)`` (HDF5 whole model).

Both optimizer generations are covered: Keras 2.11+ optimizers (``tf_keras.optimizers.Adam``,
state in ``optimizer/_variables/N``) and legacy ones (``tf_keras.optimizers.legacy.Adam``, state
in per-variable ``.OPTIMIZER_SLOT``\\ s). Everything is generated at test time in tmp dirs.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.import_determined import determined_fixtures as fx

TRAIN_STEPS = 3
BATCH = 4


@dataclasses.dataclass(frozen=True)
class OptimizerCase:
    """One optimizer as Keras 2 trained with it, and the Keras 3 optimizer a user compiles."""

    name: str
    keras2: Callable[[Any], Any]  # tf_keras module -> optimizer
    keras3: Callable[[float], Any]  # learning rate -> Keras 3 optimizer
    learning_rate: float
    legacy: bool
    slots: tuple[tuple[str, str], ...]  # (Keras 2 attribute or legacy slot name, Keras 3 attribute)
    scalars: tuple[str, ...] = ()  # Keras 3 scalar state loaded besides iterations and the rate
    atol: float = 1e-6  # one more step in Keras 3 vs tf_keras (float32 op-order differences)
    same_update_rule: bool = True  # False: Keras 3's update differs, only the state is compared


def _keras3(cls_name: str, **kwargs: Any) -> Callable[[float], Any]:
    def make(learning_rate: float) -> Any:
        import keras

        return getattr(keras.optimizers, cls_name)(learning_rate=learning_rate, **kwargs)

    return make


ADAM_SLOTS = (("_momentums", "_momentums"), ("_velocities", "_velocities"))
OPTIMIZERS = {
    case.name: case
    for case in (
        OptimizerCase(
            "adam",
            lambda tfk: tfk.optimizers.Adam(0.02),
            _keras3("Adam"),
            0.02,
            False,
            ADAM_SLOTS,
        ),
        OptimizerCase(
            "adam_amsgrad",
            lambda tfk: tfk.optimizers.Adam(0.02, amsgrad=True),
            _keras3("Adam", amsgrad=True),
            0.02,
            False,
            ADAM_SLOTS + (("_velocity_hats", "_velocity_hats"),),
        ),
        OptimizerCase(
            "sgd_momentum",
            lambda tfk: tfk.optimizers.SGD(0.05, momentum=0.9),
            _keras3("SGD", momentum=0.9),
            0.05,
            False,
            (("momentums", "momentums"),),
        ),
        OptimizerCase(
            "rmsprop_centered_momentum",
            lambda tfk: tfk.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
            _keras3("RMSprop", momentum=0.5, centered=True),
            0.01,
            False,
            (
                ("_velocities", "_velocities"),
                ("_momentums", "_momentums"),
                ("_average_gradients", "_average_gradients"),
            ),
        ),
        OptimizerCase(
            "adam_ema",
            lambda tfk: tfk.optimizers.Adam(0.02, use_ema=True),
            _keras3("Adam", use_ema=True),
            0.02,
            False,
            ADAM_SLOTS + (("_model_variables_moving_average", "_model_variables_moving_average"),),
        ),
        OptimizerCase(
            "adamw",
            lambda tfk: tfk.optimizers.AdamW(0.02, weight_decay=0.01),
            _keras3("AdamW", weight_decay=0.01),
            0.02,
            False,
            ADAM_SLOTS,
        ),
        OptimizerCase(
            "nadam",
            lambda tfk: tfk.optimizers.Nadam(0.02),
            _keras3("Nadam"),
            0.02,
            False,
            ADAM_SLOTS,
            scalars=("_u_product",),
            atol=2e-5,
        ),
        OptimizerCase(
            "adamax",
            lambda tfk: tfk.optimizers.Adamax(0.02),
            _keras3("Adamax"),
            0.02,
            False,
            (("_m", "_m"), ("_u", "_u")),
        ),
        OptimizerCase(
            "lion",
            lambda tfk: tfk.optimizers.Lion(0.01),
            _keras3("Lion"),
            0.01,
            False,
            (("momentums", "_momentums"),),
        ),
        OptimizerCase(
            "rmsprop",
            lambda tfk: tfk.optimizers.RMSprop(0.01),
            _keras3("RMSprop"),
            0.01,
            False,
            (("_velocities", "_velocities"),),
        ),
        OptimizerCase(
            "adagrad",
            lambda tfk: tfk.optimizers.Adagrad(0.05),
            _keras3("Adagrad"),
            0.05,
            False,
            (("_accumulators", "_accumulators"),),
        ),
        OptimizerCase(
            "adadelta",
            lambda tfk: tfk.optimizers.Adadelta(0.5),
            _keras3("Adadelta"),
            0.5,
            False,
            (
                ("_accumulated_grads", "_accumulated_grads"),
                ("_accumulated_delta_vars", "_accumulated_delta_vars"),
            ),
        ),
        OptimizerCase(
            "ftrl",
            lambda tfk: tfk.optimizers.Ftrl(0.05),
            _keras3("Ftrl"),
            0.05,
            False,
            (("_accumulators", "_accumulators"), ("_linears", "_linears")),
        ),
        OptimizerCase(
            "legacy_adam",
            lambda tfk: tfk.optimizers.legacy.Adam(0.02),
            _keras3("Adam"),
            0.02,
            True,
            (("m", "_momentums"), ("v", "_velocities")),
        ),
        OptimizerCase(
            "legacy_sgd_momentum",
            lambda tfk: tfk.optimizers.legacy.SGD(0.05, momentum=0.9),
            _keras3("SGD", momentum=0.9),
            0.05,
            True,
            (("momentum", "momentums"),),
        ),
        OptimizerCase(
            "legacy_rmsprop_momentum",
            lambda tfk: tfk.optimizers.legacy.RMSprop(0.01, momentum=0.5),
            _keras3("RMSprop", momentum=0.5),
            0.01,
            True,
            (("rms", "_velocities"), ("momentum", "_momentums")),
            atol=2e-5,  # legacy RMSprop adds epsilon inside the square root
        ),
        OptimizerCase(
            "legacy_adamax",
            lambda tfk: tfk.optimizers.legacy.Adamax(0.02),
            _keras3("Adamax"),
            0.02,
            True,
            (("m", "_m"), ("v", "_u")),
        ),
        OptimizerCase(
            "legacy_adagrad",
            lambda tfk: tfk.optimizers.legacy.Adagrad(0.05),
            _keras3("Adagrad"),
            0.05,
            True,
            (("accumulator", "_accumulators"),),
        ),
        OptimizerCase(
            "legacy_adadelta",
            lambda tfk: tfk.optimizers.legacy.Adadelta(0.5),
            _keras3("Adadelta"),
            0.5,
            True,
            (("accum_grad", "_accumulated_grads"), ("accum_var", "_accumulated_delta_vars")),
        ),
        OptimizerCase(
            "legacy_ftrl",
            lambda tfk: tfk.optimizers.legacy.Ftrl(0.05),
            _keras3("Ftrl"),
            0.05,
            True,
            (("accumulator", "_accumulators"), ("linear", "_linears")),
        ),
        OptimizerCase(
            "legacy_nadam",
            lambda tfk: tfk.optimizers.legacy.Nadam(0.02),
            _keras3("Nadam"),
            0.02,
            True,
            (("m", "_momentums"), ("v", "_velocities")),
            same_update_rule=False,  # momentum schedule 0.96**(0.004 t) and built-in lr decay
        ),
    )
}


def data(seed: int = 0, batches: int = TRAIN_STEPS + 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batches * BATCH, 3)).astype("float32")
    y = rng.normal(size=(batches * BATCH, 2)).astype("float32")
    return x, y


def build_tf_keras_model(optimizer: Any, *, batch_norm: bool = False) -> Any:
    """Input(3) -> Dense(4, tanh) [-> BatchNormalization] -> Dense(2), in Keras 2."""
    import tf_keras

    layers = [tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh")]
    if batch_norm:
        layers.append(tf_keras.layers.BatchNormalization())
    layers.append(tf_keras.layers.Dense(2))
    model = tf_keras.Sequential(layers)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def build_keras3_model(optimizer: Any | None, *, batch_norm: bool = False) -> Any:
    """The same architecture in Keras 3, as the user's code would build it."""
    import keras

    layers = [keras.Input((3,)), keras.layers.Dense(4, activation="tanh")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(2))
    model = keras.Sequential(layers)
    if optimizer is not None:
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    return model


def train_tf_keras(case: OptimizerCase, *, seed: int = 0, batch_norm: bool = False) -> Any:
    """A tf_keras model trained TRAIN_STEPS steps with ``case``'s optimizer."""
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    model = build_tf_keras_model(case.keras2(tf_keras), batch_norm=batch_norm)
    x, y = data(seed)
    for step in range(TRAIN_STEPS):
        model.train_on_batch(
            x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
        )
    return model


def next_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The batch after the ones the fixture model was trained on."""
    x, y = data(seed)
    return x[TRAIN_STEPS * BATCH :], y[TRAIN_STEPS * BATCH :]


def optimizer_state(model: Any, case: OptimizerCase) -> dict[str, list[np.ndarray]]:
    """The Keras 2 model's optimizer state per Keras 3 attribute, one array per trainable var."""
    optimizer = model.optimizer
    state: dict[str, list[np.ndarray]] = {}
    for keras2, keras3 in case.slots:
        if case.legacy:
            values = [optimizer.get_slot(v, keras2) for v in model.trainable_variables]
        else:
            values = list(getattr(optimizer, keras2))
        state[keras3] = [np.asarray(v) for v in values]
    return state


def save_callback_checkpoint(model: Any, folder: str, *, steps_completed: int = 3) -> str:
    """What DeterminedCallback wrote: ``model.save_weights(<dir>/model_checkpoint)``."""
    os.makedirs(folder, exist_ok=True)
    model.save_weights(os.path.join(folder, "model_checkpoint"))
    return fx.write_callback_extras(folder, steps_completed=steps_completed, epoch=0, continue_id=1)


def save_optimizer_h5(model: Any, path: str) -> None:
    """``determined-keras-optimizer-weights.h5`` as TFKerasTrial._save_checkpoint wrote it."""
    import h5py
    from tf_keras.src.saving.legacy.hdf5_format import save_optimizer_weights_to_hdf5_group

    with h5py.File(path, "w") as h5file:
        for idx, optimizer in enumerate([model.optimizer]):
            save_optimizer_weights_to_hdf5_group(h5file.create_group(f"optimizer-{idx}"), optimizer)


def save_tfkeras_trial_checkpoint(
    model: Any, folder: str, *, steps_completed: int = 3, marker: str | None = None
) -> str:
    """What TFKerasTrial wrote: TF-format weights plus the optimizer in HDF5, and its pickles."""
    os.makedirs(folder, exist_ok=True)
    model.save_weights(os.path.join(folder, "determined-keras-model-weights"), save_format="tf")
    save_optimizer_h5(model, os.path.join(folder, "determined-keras-optimizer-weights.h5"))
    return fx.write_tfkeras_trial_extras(folder, steps_completed=steps_completed, marker=marker)


def save_h5_model_checkpoint(model: Any, folder: str) -> str:
    """An old TFKerasTrial checkpoint: the whole Keras 2 model in ``determined-keras-model.h5``."""
    import json

    os.makedirs(folder, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*HDF5 file.*legacy", category=UserWarning)
        model.save(os.path.join(folder, "determined-keras-model.h5"), save_format="h5")
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"format": "h5", "framework": "tensorflow-2.15.0", "steps_completed": 3}, f)
    return folder


def save_012_h5_model_checkpoint(model: Any, folder: str) -> str:
    """A Determined 0.12-era TFKerasTrial checkpoint: the whole Keras 2 model saved as HDF5
    under the name ``determined-keras-model`` (no extension), alone in its folder."""
    os.makedirs(folder, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*HDF5 file.*legacy", category=UserWarning)
        model.save(os.path.join(folder, "determined-keras-model"), save_format="h5")
    return folder


SAVERS = {
    "callback": save_callback_checkpoint,
    "tfkeras_trial": save_tfkeras_trial_checkpoint,
    "tfkeras_h5": save_h5_model_checkpoint,
    "tfkeras_h5_012": save_012_h5_model_checkpoint,
}
