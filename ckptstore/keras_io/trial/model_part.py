"""The model part of a TFKerasTrial checkpoint: what lets training resume always commits; the
full model file is best effort.

Keras 3 writes ``model.keras`` (architecture, weights, optimizer state). A subclassed model that
Keras cannot serialize (its ``__init__`` takes sub-models or other non-serializable arguments
and it has no ``get_config``) gets ``model.weights.h5`` instead, as Determined saved weights
only for trials: the checkpoint commits, its metadata's ``missing`` says what is absent and why,
and one warning per trial names the fix. Keras 2 writes its TF checkpoint layout
(:mod:`ckptstore.keras_io.saving._keras2_format`), which holds any model's weights. Every
optimizer (``model.optimizer`` and the wrapped ones) goes to ``optimizers.json``/``.npz``
(:mod:`ckptstore.keras_io.trial.optimizers`).

Example::

    writer = ModelPartWriter()
    missing = writer.write(model, named_optimizers, folder)   # [] or one "missing" entry
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME
from ckptstore.keras_io.trial import optimizers

logger = logging.getLogger(__name__)

#: The weights of a Keras 3 model that ``model.keras`` could not hold.
WEIGHTS_FILENAME = "model.weights.h5"

#: What Keras raises when a model (or a layer in it) cannot be serialized to a config.
_UNSERIALIZABLE = (NotImplementedError, TypeError, ValueError)


def _fix(model: KerasModel) -> str:
    name = type(model).__name__
    return (
        f"give {name} a get_config() (and from_config() for sub-model arguments) and register "
        f"it with @keras.saving.register_keras_serializable(), or load these checkpoints with "
        f"load_model_from_checkpoint_path(path, model={name}(...)) built by your code"
    )


class ModelPartWriter:
    """Writes the model part of each checkpoint of one trial; warns once per trial."""

    def __init__(self) -> None:
        self._warned = False

    def write(self, model: KerasModel, named: dict[str, Any], folder: str) -> list[dict[str, str]]:
        """Write the model and optimizers into ``folder``; returns the ``missing`` metadata
        entries (empty when everything was written)."""
        missing: list[dict[str, str]] = []
        if backend.IS_KERAS2:  # model_checkpoint.* (weights + optimizer), model_config.json
            layout = keras2_format.Keras2Layout.of(model)
            keras2_format.take_snapshot(layout).write_into(folder)
        else:
            missing = self._write_keras3(model, folder)
        optimizers.write(folder, model, named)
        return missing

    def _write_keras3(self, model: KerasModel, folder: str) -> list[dict[str, str]]:
        mark_built(model)
        full = os.path.join(folder, MODEL_FILENAME)
        try:
            with warnings.catch_warnings():
                # an unbuilt outer model (a GAN whose sub-models hold every variable) is fine
                warnings.filterwarnings("ignore", message=".*has not yet been built.*")
                model.save(full)
            return []
        except _UNSERIALIZABLE as exc:
            if os.path.exists(full):
                os.remove(full)
            # Keras's message opens with a blank line and ends with a long example: keep its
            # first paragraph on one line
            first = str(exc).strip().split("\n\n")[0] or repr(exc)
            why = f"{type(model).__name__} cannot be saved as a full model: " + " ".join(
                first.split()
            )
        model.save_weights(os.path.join(folder, WEIGHTS_FILENAME))
        fix = _fix(model)
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"Checkpoints of this trial hold the model's weights and optimizer state "
                f"({WEIGHTS_FILENAME}, {optimizers.OPTIMIZERS_FILENAME}) but no {MODEL_FILENAME}:"
                f" {why} They resume exactly. To get the full model, {fix}.",
                UserWarning,
                stacklevel=2,
            )
        return [{"what": f"full model ({MODEL_FILENAME})", "why": why[:2000], "fix": fix}]


def mark_built(model: KerasModel) -> bool:
    """Mark built a model whose layers are all built (a GAN whose custom ``train_step`` calls
    its sub-models, never the model itself): Keras 3 saves and loads weights only of built
    models. Returns whether the model is built."""
    if model.built:
        return True
    layers = list(getattr(model, "layers", []))
    if layers and all(layer.built for layer in layers):
        model.built = True
    return bool(model.built)


def has_model_part(folder: str) -> bool:
    """Whether ``folder`` holds a Keras 3 trial's model part (full model or weights)."""
    return any(os.path.exists(os.path.join(folder, n)) for n in (MODEL_FILENAME, WEIGHTS_FILENAME))


__all__ = ["WEIGHTS_FILENAME", "ModelPartWriter", "has_model_part", "mark_built"]
