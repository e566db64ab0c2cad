"""The variables of a TFKerasTrial's model that ``model.keras`` leaves out, in its checkpoints:
on Keras 3 the ``SeedGenerator`` states of ``Dropout``, noise and augmentation layers. Without
them a resumed trial draws other dropout masks than an uninterrupted one from its first batch.

They are captured with :func:`~ckptstore.keras_io.fit._callback_state.capture_extra_variables`
(``callback_state.json``'s ``extra_variables``, keyed by variable path, as
``DeterminedCallback`` writes them) and put back by position among the same variables of the
rebuilt model: a variable's path holds its layer's name, which differs when the process built
another model first (``dropout_3`` against ``dropout``). Keras 2 keeps its layers' generators
elsewhere (:func:`~ckptstore.keras_io.saving._keras2_format.capture_layer_rng`), so both are
empty there; its default ``Dropout`` RNG (TensorFlow's legacy stateful ops) has no state at all,
which :func:`warn_unsaved` says once per trial.

Example::

    extra = capture(model)               # {"sequential/dropout/seed_generator_state": {...}}
    restore(model, extra, "ckpt-uuid")   # on the model build_model() made in the new run
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.fit import _callback_state as callback_state
from ckptstore.keras_io.saving import _keras2_format as keras2_format

logger = logging.getLogger(__name__)


def _left_out(model: KerasModel) -> list[Any]:
    """The model's variables that are neither weights nor metric accumulators, in order."""
    skip = {id(v) for v in model.weights} | {id(v) for v in getattr(model, "metrics_variables", [])}
    return [v for v in model.variables if id(v) not in skip]


def capture(model: KerasModel) -> dict[str, Any]:
    """``{path: {"dtype", "value"}}`` of the variables ``model.keras`` leaves out (Keras 3)."""
    if backend.IS_KERAS2:
        return {}
    return callback_state.capture_extra_variables(model, {id(v) for v in model.weights})


def restore(model: KerasModel, extra: dict[str, Any], uuid: str) -> None:
    """Assign what :func:`capture` recorded, by position; ResumeError when the model has
    other such variables (another model than the one that wrote checkpoint ``uuid``)."""
    if not extra or backend.IS_KERAS2:
        return
    variables, saved = _left_out(model), list(extra.items())
    shapes = [tuple(v.shape) for v in variables]
    values = [np.asarray(item["value"], dtype=item["dtype"]) for _, item in saved]
    if shapes != [value.shape for value in values]:
        raise errors.ResumeError(
            f"Checkpoint {uuid} holds the states of {[path for path, _ in saved]} (shapes "
            f"{[value.shape for value in values]}); the model build_model() made has "
            f"{[getattr(v, 'path', v.name) for v in variables]} (shapes {shapes}). Build the "
            "model the run that wrote the checkpoint built."
        )
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def warn_unsaved(model: KerasModel) -> None:
    """Keras 2: one warning naming the layers whose draws no checkpoint can hold."""
    legacy = keras2_format.legacy_rng_layers(model) if backend.IS_KERAS2 else []
    if legacy:
        logger.warning(
            "Layers %s of this trial use Keras 2's default RNG, which has no state to save: "
            "after a resume they draw other values than an uninterrupted trial would. Call "
            "tf.keras.backend.experimental.enable_tf_random_generator() at the top of "
            "model_def.py for checkpoints that hold their RNG state.",
            legacy,
        )


__all__ = ["capture", "restore", "warn_unsaved"]
