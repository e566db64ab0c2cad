"""Planning a Determined checkpoint's load: which stored value goes into which Keras variable.

Every check (shapes, optimizer names and layouts, hyperparameters) happens while the plan is
built; :class:`_Plan` assigns the values only once all of them passed, so a mismatch leaves the
model untouched. The readers of Determined's files (TF object-graph checkpoints, HDF5) live in
:mod:`ckptstore.import_determined.weights` and build their plans with these functions.

Example::

    plan = _plan_in_order(model.weights, stored_values, where="model_checkpoint")
    plan.commit()
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_model import KerasModel

# The loader's messages keep the public module's logger name, which users filter on.
logger = logging.getLogger("ckptstore.import_determined.weights")

#: Keras 2 legacy slot name -> Keras 3 optimizer attributes that may hold that slot (first found wins).
SLOT_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "m": ("_momentums", "_m"),
    "v": ("_velocities", "_u"),
    "vhat": ("_velocity_hats",),
    "momentum": ("momentums", "_momentums"),
    "rms": ("_velocities",),
    "mg": ("_average_gradients",),
    "accumulator": ("_accumulators",),
    "linear": ("_linears",),
    "accum_grad": ("_accumulated_grads",),
    "accum_var": ("_accumulated_delta_vars",),
}
#: Keras 2.11+ optimizer class -> the state blocks its ``build()`` appends to ``_variables`` after
#: ``iterations`` (and the EMA averages), in order. Each block holds one variable per slot for the
#: first trainable variable, then for the second, ...; slots are named by the Keras 3 attribute that
#: holds the same state. A block the Keras 3 optimizer does not have (RMSprop without momentum,
#: Adam without amsgrad) was not built by Keras 2 either, with the same settings.
NEW_LAYOUT_BLOCKS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Adam": (("_momentums", "_velocities"), ("_velocity_hats",)),
    "AdamW": (("_momentums", "_velocities"), ("_velocity_hats",)),
    "Nadam": (("_momentums", "_velocities"),),
    "Adamax": (("_m", "_u"),),
    "SGD": (("momentums",),),
    "Lion": (("_momentums",),),
    "RMSprop": (("_velocities",), ("_momentums",), ("_average_gradients",)),
    "Adagrad": (("_accumulators",),),
    "Adadelta": (("_accumulated_grads", "_accumulated_delta_vars"),),
    "Ftrl": (("_accumulators", "_linears"),),
}
#: Scalar optimizer variables Keras 2.11+ tracks outside ``_variables`` and Keras 3 keeps too.
NEW_LAYOUT_SCALARS = ("_u_product",)
#: Legacy hyperparameters stored as variables; a compiled value that differs is warned about.
LEGACY_HYPERPARAMETERS = ("beta_1", "beta_2", "momentum", "rho", "decay")
#: Optimizer settings read from an HDF5 model's ``training_config``; a differing one is warned about.
HDF5_CONFIG_HYPERPARAMETERS = (
    *LEGACY_HYPERPARAMETERS,
    "epsilon",
    "amsgrad",
    "centered",
    "nesterov",
)
ITERATION_NAMES = ("iter", "iterations", "_iterations")
LEARNING_RATE_NAMES = ("learning_rate", "lr", "_learning_rate")
_SKIP_CHILDREN = {"optimizer", "save_counter", "keras_api", "_CHECKPOINTABLE_OBJECT_GRAPH"}
_LAYER_RE = re.compile(r"^layer_with_weights-(\d+)$")
_VALUE_ATTR = "VARIABLE_VALUE"


@dataclasses.dataclass
class _Plan:
    """Checked (variable, value) pairs, assigned only once everything has been checked."""

    assignments: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)
    iterations: int | None = None
    learning_rate: float | None = None
    optimizer_layout: str | None = None

    def extend(self, other: _Plan) -> None:
        self.assignments.extend(other.assignments)
        for field in ("iterations", "learning_rate", "optimizer_layout"):
            if getattr(other, field) is not None:
                setattr(self, field, getattr(other, field))

    def commit(self) -> int:
        for variable, value in self.assignments:
            value = np.asarray(value)
            variable.assign(value.astype(_np_dtype(variable)))
        return len(self.assignments)


def _np_dtype(variable: Any) -> Any:
    dtype = variable.dtype
    return getattr(dtype, "as_numpy_dtype", dtype)


def _label(variable: Any) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", variable))


# ---- planning ------------------------------------------------------------------------------------
def _plan_in_order(
    targets: Sequence[Any], values: Sequence[tuple[str, np.ndarray]], where: str
) -> _Plan:
    if len(targets) != len(values):
        names = ", ".join(name for name, _ in values[:6])
        raise errors.ModelLoadError(
            f"{where} holds {len(values)} weight(s) ({names}{', ...' if len(values) > 6 else ''}) "
            f"but the Keras model has {len(targets)}. Build the same architecture the checkpoint "
            "was trained with (same layers in the same order) before loading."
        )
    for index, (variable, (name, value)) in enumerate(zip(targets, values, strict=True)):
        if tuple(variable.shape) != tuple(value.shape):
            raise errors.ModelLoadError(
                f"Weight #{index} {name!r} in {where} has shape {tuple(value.shape)} but the model's "
                f"variable {_label(variable)!r} has shape {tuple(variable.shape)}. Build the model "
                "exactly as it was trained."
            )
    return _Plan([(variable, value) for variable, (_, value) in zip(targets, values, strict=True)])


def _optimizer_for(model: KerasModel) -> Any | None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    if not getattr(optimizer, "built", getattr(optimizer, "_built", True)):  # tf_keras: _built
        optimizer.build(model.trainable_variables)
    return optimizer


def _not_compiled(where: str) -> None:
    logger.warning(
        "%s holds optimizer state but the model is not compiled; only weights were loaded. "
        "Compile the model first to restore the optimizer too.",
        where,
    )


def _slot_list(optimizer: Any, slot: str) -> list[Any] | None:
    for attr in SLOT_ATTRIBUTES.get(slot, ()):
        values = getattr(optimizer, attr, None)
        if isinstance(values, list | tuple) and values:
            return list(values)
    return None


#: Legacy (TF < 2.11) optimizers whose update rule differs from the Keras 3 optimizer of the same
#: name: their state loads, but training continues with Keras 3's rule.
LEGACY_ALGORITHM_NOTES = {
    "Nadam": (
        "legacy Nadam's momentum schedule is 0.96**(0.004*t) with learning-rate decay 0.004 "
        "built in, Keras 3 Nadam's is 0.96**t without decay"
    ),
    "RMSprop": (
        "legacy RMSprop adds epsilon inside the square root, Keras 3 outside (a tiny "
        "numerical difference)"
    ),
}


def _plan_legacy_slots(
    optimizer: Any,
    model: KerasModel,
    slots: list[tuple[str, Any, np.ndarray, str]],
    where: str,
) -> _Plan:
    """``slots`` = (slot name, model variable, value, source name)."""
    plan = _Plan(optimizer_layout="legacy" if slots else None)
    note = LEGACY_ALGORITHM_NOTES.get(type(optimizer).__name__)
    if slots and note:
        logger.warning(
            "%s: optimizer state loaded, but %s; training continues with Keras 3's rule.",
            where,
            note,
        )
    trainable_ids = {id(v): i for i, v in enumerate(model.trainable_variables)}
    for slot, variable, value, name in slots:
        targets = _slot_list(optimizer, slot)
        if targets is None:
            raise errors.ModelLoadError(
                f"{where} has optimizer slot {slot!r} ({name}) but the model's optimizer "
                f"{type(optimizer).__name__} has no such state. Compile the model with the "
                "optimizer it was trained with (e.g. Adam for m/v slots), or pass "
                "load_optimizer=False to load the weights only."
            )
        index = trainable_ids.get(id(variable))
        if index is None:
            continue
        target = targets[index]
        if target is None:
            continue
        if tuple(target.shape) != tuple(value.shape):
            raise errors.ModelLoadError(
                f"Optimizer slot {name!r} in {where} has shape {tuple(value.shape)}, the model's "
                f"{_label(target)} has {tuple(target.shape)}."
            )
        plan.assignments.append((target, value))
    return plan


def _iterations_variable(optimizer: Any) -> Any:
    variable = getattr(optimizer, "_iterations", None)
    return variable if hasattr(variable, "assign") else optimizer.iterations


def _plan_iterations(optimizer: Any, value: Any, name: str, where: str) -> _Plan:
    value = np.asarray(value)
    if value.shape != () or value.dtype.kind not in "iu":
        raise errors.ModelLoadError(
            f"{where}: {name!r} should be the optimizer's iteration count (an integer scalar) but "
            f"holds {value.dtype} of shape {value.shape}; the checkpoint's optimizer is not laid "
            "out as Keras 2 writes it. Pass load_optimizer=False to load the weights only."
        )
    return _Plan([(_iterations_variable(optimizer), value)], iterations=int(value))


def _plan_learning_rate(optimizer: Any, value: Any, name: str) -> _Plan:
    target = getattr(optimizer, "_learning_rate", None)
    value = float(np.asarray(value))
    if not hasattr(target, "assign") or not hasattr(target, "shape"):
        logger.info(
            "Checkpoint learning rate %s (%s) not restored: the Keras 3 optimizer uses a schedule "
            "or a callable.",
            value,
            name,
        )
        return _Plan()
    return _Plan([(target, np.float32(value))], learning_rate=value)


def _trainable_shapes_check(
    value: np.ndarray, variable: Any, target: Any, name: str, where: str
) -> None:
    expected = tuple(variable.shape)
    if tuple(value.shape) != expected or (target is not None and tuple(target.shape) != expected):
        raise errors.ModelLoadError(
            f"Optimizer variable {name!r} in {where} has shape {tuple(value.shape)} but it belongs "
            f"to the model's trainable variable {_label(variable)!r} of shape {expected}. Build the "
            "model exactly as it was trained and compile it with the same optimizer and settings."
        )


def nadam_u_product(beta_1: float, iterations: int) -> np.float32:
    """Nadam's running product of momentum-schedule terms after ``iterations`` steps, computed
    step by step in float32 as Keras 2.11+ and Keras 3 do (``u_t = beta_1 * (1 - 0.5 * 0.96**t)``).
    Keras 2 HDF5 optimizer files do not store it (it is not in ``_variables``)."""
    product = np.float32(1.0)
    beta = np.float32(beta_1)
    for step in range(1, iterations + 1):
        u_t = beta * (np.float32(1.0) - np.float32(0.5) * np.float32(0.96) ** np.float32(step))
        product = np.float32(product * u_t)
    return product


def _plan_new_layout(
    optimizer: Any,
    model: KerasModel,
    values: Sequence[tuple[str, np.ndarray]],
    where: str,
    *,
    iterations: int,
    scalars: dict[str, np.ndarray] | None = None,
) -> _Plan:
    """Map a Keras 2.11+ optimizer's ``_variables`` (without ``iterations``) onto ``optimizer``.

    ``scalars``: state tracked outside ``_variables`` (Nadam's ``_u_product``) where stored."""
    kind = type(optimizer).__name__
    blocks = NEW_LAYOUT_BLOCKS.get(kind)
    if blocks is None:
        raise errors.ModelLoadError(
            f"{where} stores optimizer state in the Keras 2.11+ layout, which ckptstore maps for "
            f"{', '.join(sorted(NEW_LAYOUT_BLOCKS))}, not for the model's {kind}. Compile with "
            "the optimizer the checkpoint was trained with, or pass load_optimizer=False to load "
            "the weights only."
        )
    trainable = list(model.trainable_variables)
    # one entry per block: the Keras 3 slot lists (None: state Keras 2 built but Keras 3 has not)
    layout: list[list[list[Any] | None]] = []
    if getattr(optimizer, "use_ema", False):
        layout.append([list(optimizer._model_variables_moving_average)])
    for block in blocks:
        lists = [getattr(optimizer, attr, None) for attr in block]
        if all(isinstance(slot_list, list | tuple) and slot_list for slot_list in lists):
            layout.append([list(slot_list) for slot_list in lists])
        elif kind == "SGD":
            layout.append([None])  # Keras 2 SGD builds momentums even with momentum=0
    expected = sum(len(block) for block in layout) * len(trainable)
    if len(values) != expected:
        per_variable = len(values) / len(trainable) if trainable else float(len(values))
        raise errors.ModelLoadError(
            f"{where} holds {len(values)} optimizer state variable(s) besides iterations "
            f"({per_variable:g} per trainable variable) but the model's {kind} with its "
            f"settings has {expected} ({expected // max(len(trainable), 1)} per trainable variable "
            f"for {len(trainable)} trainable variables). Compile with the optimizer and settings "
            "it was trained with (amsgrad, momentum, centered, use_ema), or pass "
            "load_optimizer=False to load the weights only."
        )
    plan = _Plan(optimizer_layout="keras_2_11")
    position = 0
    for block in layout:
        for index, variable in enumerate(trainable):
            for slot_list in block:
                name, value = values[position]
                position += 1
                target = slot_list[index] if slot_list is not None else None
                _trainable_shapes_check(value, variable, target, name, where)
                if target is not None:
                    plan.assignments.append((target, value))
    scalars = dict(scalars or {})
    if kind == "Nadam" and "_u_product" not in scalars:
        scalars["_u_product"] = nadam_u_product(float(optimizer.beta_1), iterations)
    for scalar, value in scalars.items():
        target = getattr(optimizer, scalar, None)
        if hasattr(target, "assign"):
            plan.assignments.append((target, value))
    if any(block == [None] for block in layout):
        logger.warning(
            "%s holds SGD momentum buffers but the model's SGD has momentum=0, so they are "
            "ignored. Keras 2 SGD keeps these buffers even with momentum=0 (unused then); if the "
            "run used momentum, compile SGD(momentum=...) with its value to continue it.",
            where,
        )
    return plan


def _check_optimizer_name(optimizer: Any, stored: str, where: str) -> None:
    kind = type(optimizer).__name__
    if stored in NEW_LAYOUT_BLOCKS and stored != kind:
        raise errors.ModelLoadError(
            f"{where} holds {stored} optimizer state but the model is compiled with {kind}. "
            f"Compile with {stored} (same settings), or pass load_optimizer=False to load the "
            "weights only."
        )


def _warn_hyperparameter(optimizer: Any, name: str, stored: float, where: str) -> None:
    compiled = getattr(optimizer, name, None)
    if name == "decay" and stored:
        logger.warning(
            "%s was trained with learning-rate decay=%s, which Keras 3 optimizers do not have; "
            "use a keras.optimizers.schedules.InverseTimeDecay to continue it.",
            where,
            stored,
        )
    elif isinstance(compiled, float | int) and not np.isclose(float(compiled), stored):
        logger.warning(
            "%s was trained with %s=%s but the model's optimizer has %s; training continues "
            "with %s.",
            where,
            name,
            stored,
            compiled,
            compiled,
        )
