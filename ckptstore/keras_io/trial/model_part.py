"""The model part of a TFKerasTrial checkpoint: what lets training resume always commits; the
full model file is best effort.

Keras 3 writes ``model.keras`` (architecture, weights, optimizer state). A subclassed model that
Keras cannot serialize (its ``__init__`` takes sub-models or other non-serializable arguments
and it has no ``get_config``) gets ``model.weights.h5`` instead, as Determined saved weights
only for trials: the checkpoint commits, its metadata's ``missing`` says what is absent and why,
and one warning per trial names the fix. Keras 2 writes its TF checkpoint layout
(:mod:`ckptstore.keras_io.saving._keras2_format`), which holds any model's weights. Every
optimizer (``model.optimizer`` and the wrapped ones) goes to ``optimizers.json``/``.npz``
(:mod:`ckptstore.keras_io.saving._optimizers`).

Example::

    writer = ModelPartWriter()
    missing = writer.write(model, named_optimizers, folder)   # [] or one "missing" entry
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.checkpointing.jsonfiles import read_json_file
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _optimizers as optimizers
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME

logger = logging.getLogger(__name__)

#: The weights of a Keras 3 model that ``model.keras`` could not hold.
WEIGHTS_FILENAME = "model.weights.h5"

#: The file every TFKerasTrial checkpoint has (data position and schedule).
SEQUENCER_FILENAME = "workload_sequencer.json"
#: Checkpoint metadata key naming the trial class (``module:QualName``) that built the model.
TRIAL_CLASS_KEY = "trial_class"

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
        if backend.IS_KERAS2:  # model_checkpoint.* (weights + optimizer), model_config.json
            layout = keras2_format.Keras2Layout.of(model)
            keras2_format.take_snapshot(layout).write_into(folder)
            missing = []
            if not _keras2_config_rebuilds(folder):
                why = f"{type(model).__name__} is a subclassed model Keras 2 cannot rebuild"
                missing = self._missing(model, why, keras2_format.MODEL_CONFIG_FILENAME)
        else:
            missing = self._write_keras3(model, folder)
        optimizers.write(folder, model, named)
        return missing

    def _missing(self, model: KerasModel, why: str, what: str) -> list[dict[str, str]]:
        """The metadata entry for a checkpoint without a full model; warns once per trial."""
        fix = _fix(model)
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"Checkpoints of this trial hold the model's weights and every optimizer's "
                f"state but no usable {what}: {why}. They resume exactly. To get the full "
                f"model, {fix}.",
                UserWarning,
                stacklevel=3,
            )
        return [{"what": f"full model ({what})", "why": why[:2000], "fix": fix}]

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
        return self._missing(model, why, MODEL_FILENAME)


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


def check_layout(path: str, uuid: str) -> None:
    """ResumeError unless ``path`` holds the model in the running Keras's layout."""
    has_keras3 = has_model_part(path)
    has_keras2 = keras2_format.has_weights(path)
    if has_keras2 if backend.IS_KERAS2 else has_keras3:
        return
    running = "Keras 2 (tf_keras)" if backend.IS_KERAS2 else "Keras 3"
    if has_keras2 or has_keras3:
        written = "Keras 3 (model.keras)" if has_keras3 else "Keras 2 (model_checkpoint.*)"
        hint = (
            f"unset {backend.LEGACY_ENV} before TensorFlow is imported"
            if backend.IS_KERAS2
            else f"set {backend.LEGACY_ENV}=1 before TensorFlow is imported"
        )
        raise errors.ResumeError(
            f"Checkpoint {uuid} was written by {written}, but this trial runs on {running} "
            f"({backend.FRAMEWORK}). Resume it with the Keras that wrote it ({hint}), or "
            "start the trial from scratch."
        )
    expected = keras2_format.WEIGHTS_PREFIX + ".index" if backend.IS_KERAS2 else MODEL_FILENAME
    raise errors.ResumeError(
        f"Checkpoint {uuid} has no {expected}; it was not written by a TFKerasTrial. "
        f"Received: {sorted(os.listdir(path))}. Start the trial from scratch or pick "
        "another checkpoint."
    )


def weights_only_trial_checkpoint(folder: str) -> bool:
    """A TFKerasTrial checkpoint whose model this Keras cannot rebuild from the files alone (a
    subclassed model: weights only), so loading it needs a model built by code."""
    if not os.path.isfile(os.path.join(folder, SEQUENCER_FILENAME)):
        return False
    if backend.IS_KERAS2:
        if os.path.isdir(os.path.join(folder, "saved_model")):
            return False
        return keras2_format.has_weights(folder) and not _keras2_config_rebuilds(folder)
    return os.path.isfile(os.path.join(folder, WEIGHTS_FILENAME))


def _keras2_config_rebuilds(folder: str) -> bool:
    """Whether ``model_config.json`` describes a model Keras 2 rebuilds (Sequential or
    functional); a subclassed model's is ``{"class_name": "MyModel", "config": {}}``."""
    try:
        config = read_json_file(os.path.join(folder, keras2_format.MODEL_CONFIG_FILENAME))
    except (OSError, errors.InvalidCheckpoint):
        return False
    return isinstance(config, dict) and config.get("class_name") in ("Sequential", "Functional")


def _trial_class(folder: str, modules: Sequence[str]) -> tuple[type, dict[str, Any], str]:
    """The trial class named in the checkpoint's metadata, its hparams and its module; only
    from a module this process already imported (using it imports nothing) or one the caller
    allowed with ``modules=``."""
    if signing.verify_key() is not None:
        # metadata.json is outside every signature: it must not choose the class built, nor
        # the hyperparameters it is built with.
        raise errors.SignatureError(
            f"The TFKerasTrial checkpoint {folder} holds weights only and names its trial "
            "class and hparams only in metadata.json, which no signature covers, and a verify "
            "key is set: nothing was built. Build the model with your code and pass it: "
            "load_model_from_checkpoint_path(path, model=model)."
        )
    try:
        metadata = read_json_file(os.path.join(folder, "metadata.json"))
    except (OSError, errors.InvalidCheckpoint):
        metadata = {}
    spec = metadata.get(TRIAL_CLASS_KEY) if isinstance(metadata, dict) else None
    if not isinstance(spec, str) or ":" not in spec:
        raise errors.ModelLoadError(
            f"The TFKerasTrial checkpoint {folder} holds weights only (its model cannot be "
            "rebuilt from a config) and names no trial class to build it. Build the model with "
            "your code and pass it: load_model_from_checkpoint_path(path, model=model)."
        )
    module_name, _, qualname = spec.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        if not any(module_name == m or module_name.startswith(m + ".") for m in modules):
            raise errors.UntrustedCode(
                f"The TFKerasTrial checkpoint {folder} holds weights only; its model is built "
                f"by trial class {spec!r}, whose module is not imported here and was not "
                f"allowed. Import {module_name} yourself, pass modules=[{module_name!r}], or "
                "build the model and pass model=..."
            )
        module = importlib.import_module(module_name)
    found: Any = module
    for part in qualname.split("."):
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    from ckptstore.keras_io.trial.trial import TFKerasTrial

    # Only a trial class: a checkpoint must not make us instantiate any other class that
    # happens to be imported.
    if not isinstance(found, type) or not issubclass(found, TFKerasTrial):
        raise errors.ModelLoadError(
            f"Module {module_name!r} has no TFKerasTrial subclass {qualname!r} (the trial "
            f"class {folder} names). Build the model with your code and pass model=..."
        )
    hparams = metadata.get("hparams") if isinstance(metadata.get("hparams"), dict) else {}
    return found, hparams, spec


def build_trial_model(folder: str, modules: Sequence[str] = ()) -> KerasModel:
    """The model the checkpoint's trial class builds with the checkpoint's hyperparameters
    (see :func:`_trial_class` for which classes are used)."""
    from ckptstore.keras_io.trial.context import TFKerasTrialContext

    trial_cls, hparams, spec = _trial_class(folder, modules)
    logger.info("Building the model of %s with trial class %s", folder, spec)
    return trial_cls(TFKerasTrialContext(hparams)).build_model()


def load_into(model: KerasModel, folder: str) -> KerasModel:
    """Load a TFKerasTrial checkpoint's weights, and the state of every optimizer the model
    holds under a name the checkpoint has, into ``model`` (built by the caller's code)."""
    wrapped = list(optimizers.attribute_optimizers(model).values())
    named = optimizers.named_optimizers(model, wrapped)
    record = optimizers.read(folder) or {}
    named = {k: v for k, v in named.items() if k in record}
    mark_built(model)
    try:
        optimizers.build(model, named, {k: record[k] for k in named}, folder)
        if backend.IS_KERAS2:
            keras2_format.load_weights(model, folder, with_optimizer=False)
        else:
            full = os.path.join(folder, MODEL_FILENAME)
            model.load_weights(
                full if os.path.exists(full) else os.path.join(folder, WEIGHTS_FILENAME)
            )
        optimizers.assign(named, {k: record[k] for k in named}, folder)
    except (errors.ResumeError, ValueError) as exc:
        raise errors.ModelLoadError(
            f"The checkpoint {folder} does not fit the model passed ({type(model).__name__}): "
            f"{exc}. Build the model as the trial that wrote it did."
        ) from exc
    return model


__all__ = [
    "SEQUENCER_FILENAME",
    "TRIAL_CLASS_KEY",
    "WEIGHTS_FILENAME",
    "ModelPartWriter",
    "build_trial_model",
    "check_layout",
    "has_model_part",
    "load_into",
    "mark_built",
    "weights_only_trial_checkpoint",
]
