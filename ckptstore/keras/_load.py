"""``det.keras.load_model_from_checkpoint_path(path, tags)``: one loader for every checkpoint
layout, ckptstore's and Determined's.

The layout decides (detected from the folder's top-level names, the same rule
``ckptstore import-determined`` uses, :func:`ckptstore.import_determined.layouts.detect_layout`):

- a ckptstore checkpoint (``model.keras`` or an inference ``saved_model/``): loaded by
  :func:`ckptstore.keras_io.loading.load_model_from_folder`;
- Determined's ``TFKerasTrial`` layouts (``determined-keras-model-weights.*``, and the 0.17-era
  ``determined-keras-model.h5``) and ``DeterminedCallback``'s ``model_checkpoint.*``: the model is
  built by the trial class saved in the checkpoint's ``code/`` folder (named by ``load_data.json``,
  or by ``metadata.json``'s experiment config for checkpoints of Determined <= 0.17.7), as
  Determined did, or passed as ``model=``; its Keras 2 weights are then mapped onto it by
  :func:`ckptstore.import_determined.weights.load_determined_checkpoint`. An HDF5 whole-model
  checkpoint without code is read by Keras itself.

This module sits in ``ckptstore.keras`` because it needs both ``keras_io`` and
``import_determined`` (``keras_io`` is below ``import_determined``).

Example::

    import ckptstore as det

    model = det.keras.load_model_from_checkpoint_path("/tmp/ckpt")            # any layout
    model = det.keras.load_model_from_checkpoint_path("/tmp/old", model=my_model)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.import_determined import layouts
from ckptstore.import_determined.weights import load_determined_checkpoint
from ckptstore.keras_io.loading import (
    load_folder_in_place,
    load_model_from_folder,
    readable_folder,
)
from ckptstore.keras_io.trial import model_part
from ckptstore.keras_model import KerasModel

logger = logging.getLogger(__name__)

#: The only SavedModel tag ckptstore checkpoints carry (``model.export()``'s).
SERVE_TAGS = ("serve",)
#: The 0.17-era whole-model file, which Keras can read without the trial's code.
H5_MODEL_NAME = layouts.LAYOUT_MARKERS[layouts.TFKERAS_H5]


def _check_tags(tags: Sequence[str] | None) -> None:
    if tags is None:
        return
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise errors.InvalidConfig(
            f"tags must be a list of SavedModel tag strings, like ['serve']. Received: {tags!r}."
        )
    if tuple(tags) != SERVE_TAGS:
        raise errors.ModelLoadError(
            f"ckptstore SavedModels carry only the {list(SERVE_TAGS)} tag; other tags cannot be "
            f"loaded. Pass tags=None or ['serve']. Received: tags={list(tags)!r}."
        )


def load_h5_model(h5_file: str, custom_objects: Mapping[str, Any] | None = None) -> KerasModel:
    """A whole Keras 2 HDF5 model (Keras 3 reads the legacy format itself), uncompiled as
    Determined loaded it; ModelLoadError naming the file when Keras cannot."""
    import shutil
    import tempfile

    import keras

    try:
        if h5_file.endswith(".h5"):
            return keras.saving.load_model(
                h5_file, compile=False, custom_objects=dict(custom_objects or {}) or None
            )
        # Determined 0.12 named the file without extension; Keras picks the format by it
        with tempfile.TemporaryDirectory(prefix="ckptstore-h5-") as tmp:
            named = os.path.join(tmp, os.path.basename(h5_file) + ".h5")
            shutil.copyfile(h5_file, named)
            return keras.saving.load_model(
                named, compile=False, custom_objects=dict(custom_objects or {}) or None
            )
    except (OSError, TypeError, ValueError) as exc:
        raise errors.ModelLoadError(
            f"Keras could not read the HDF5 model {h5_file}: {exc}. If it uses custom layers, "
            "pass custom_objects={'Name': TheClass}, or build the model and pass model=..."
        ) from exc


def trial_spec(folder: str) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """``(entrypoint, hparams, experiment_config)`` saved with a Determined TFKerasTrial
    checkpoint, or None when it names no trial class."""
    load_data = layouts.read_json(os.path.join(folder, "load_data.json"))
    if load_data.get("trial_cls_spec"):
        return (
            str(load_data["trial_cls_spec"]),
            dict(load_data.get("hparams") or {}),
            dict(load_data.get("experiment_config") or {}),
        )
    # Determined <= 0.17.7: metadata.json (written by Checkpoint.download()) holds the config.
    metadata = layouts.read_json(os.path.join(folder, "metadata.json"))
    config = metadata.get("experiment_config") or {}
    entrypoint = config.get("entrypoint") if isinstance(config, dict) else None
    if isinstance(entrypoint, str) and ":" in entrypoint and " " not in entrypoint.strip():
        if signing.verify_key() is not None:
            # metadata.json is outside every signature: it must not choose code to import.
            raise errors.SignatureError(
                f"The Determined checkpoint {folder} names its trial class ({entrypoint!r}) "
                "only in metadata.json, which no signature covers, and a verify key is set: "
                "nothing was imported. Build the model with your code and pass it: "
                "load_model_from_checkpoint_path(path, model=model)."
            )
        return entrypoint, dict(metadata.get("hparams") or {}), dict(config)
    return None


def build_trial_model(folder: str, *, trust_code: bool = False) -> KerasModel | None:
    """The model ``build_model()`` of the checkpoint's own trial class returns (imported from
    ``<folder>/code``), or None when the checkpoint has no code or names no trial class.
    Importing that code runs it, so it happens only with ``trust_code=True``
    (:class:`~ckptstore.errors.UntrustedCode` otherwise, nothing imported)."""
    spec = trial_spec(folder)
    code_dir = os.path.join(folder, "code")
    if spec is None or not os.path.isdir(code_dir):
        return None
    entrypoint, hparams, config = spec
    if not trust_code:
        raise errors.UntrustedCode(
            f"The Determined checkpoint {folder} builds its model with its own code "
            f"({entrypoint!r} in code/); importing it runs it, so ckptstore did not. If you "
            "trust where the checkpoint came from, pass trust_code=True; or build the model "
            "with your code and pass it: load_model_from_checkpoint_path(path, model=model). "
            f"Received: trust_code={trust_code}."
        )
    module_name, _, attr = entrypoint.partition(":")
    from ckptstore.keras_io.trial import TFKerasTrialContext
    from ckptstore.keras_io.trial.worker import import_trial_class

    # A module of the same name imported from elsewhere (another checkpoint's code) must not
    # stand in for this checkpoint's.
    top = module_name.split(".")[0]
    cached = sys.modules.get(top)
    if cached is not None and not os.path.realpath(
        getattr(cached, "__file__", "") or ""
    ).startswith(os.path.realpath(code_dir) + os.sep):
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]
    try:
        trial_cls = import_trial_class(code_dir, module_name, attr)
    except errors.InvalidConfig as exc:
        raise errors.ModelLoadError(
            f"The checkpoint's code/ folder has no trial class {entrypoint!r} ({exc}). Build the "
            "model with your code and pass it: load_model_from_checkpoint_path(path, model=model)."
        ) from exc
    except ModuleNotFoundError as exc:
        raise errors.ModelLoadError(
            f"The trial code saved in {code_dir} imports {exc.name!r}, which is not installed "
            "here. Change its imports to `import ckptstore as det` (or install the missing "
            "package), or build the model yourself and pass it as model=..."
        ) from exc
    logger.info("Building the model with %s from %s", entrypoint, code_dir)
    context = TFKerasTrialContext(hparams, experiment_config=config)
    return trial_cls(context).build_model()


def _holds_its_keras2_model(folder: str) -> bool:
    """A Keras 2 checkpoint written by ckptstore that this process can load without model=:
    under Keras 2 (its model_config.json / SavedModel), or under Keras 3 from its SavedModel."""
    from ckptstore.keras_io import backend
    from ckptstore.keras_io.saving import SAVED_MODEL_DIRNAME, written_by_keras2

    if not written_by_keras2(folder):
        return False
    return backend.IS_KERAS2 or os.path.isdir(os.path.join(folder, SAVED_MODEL_DIRNAME))


def load_model_from_checkpoint_path(
    path: str | os.PathLike[str],
    tags: Sequence[str] | None = None,
    *,
    model: KerasModel | None = None,
    compile: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    trust_pickle: bool = False,
    trust_code: bool = False,
    modules: Sequence[str] = (),
) -> Any:
    """A Keras model from a local checkpoint folder of any layout (see the module docstring).

    Args:
        path: the checkpoint folder (download it first, e.g. with
            ``client.get_checkpoint(uuid).download(path)``, or a checkpoint folder in a local
            or ``shared_fs`` store, deduplicated or not), or a ``.keras`` file.
        tags: SavedModel tags, as in Determined; ckptstore's SavedModels have ``["serve"]``.
        model: for Determined layouts and TFKerasTrial checkpoints, the model to load the
            weights (and the state of each optimizer it holds) into, built and compiled by your
            code, instead of the one the checkpoint's ``code/`` or trial class builds. A
            TFKerasTrial checkpoint of a model Keras could not save whole (weights only) is
            built by the trial class its metadata names when that class's module is already
            imported or allowed by ``modules=``; else a typed error says to pass ``model=``.
        compile: for ``.keras`` files, as in ``keras.saving.load_model``.
        custom_objects: for ``.keras`` files, as in ``keras.saving.load_model``.
        safe_mode: for ``.keras`` files, as in ``keras.saving.load_model``.
        trust_pickle: read the pickled files of Determined checkpoints (epoch, continue_id).
        trust_code: build a Determined checkpoint's model with the trial class in its
            ``code/`` folder (imports and runs that code; refused with UntrustedCode without).
        modules: modules defining custom layers that may be imported (an allow-list); a
            checkpoint's model config never chooses what is imported.

    Raises:
        ModelLoadError: no model files, an unknown layer, a model that does not fit the
            weights, or trial code that does not import here.

    Example::

        model = det.keras.load_model_from_checkpoint_path(path)
        predictions = model.predict(x)
    """
    _check_tags(tags)
    if model is None:  # ckptstore's own model.keras, deduplicated in its store: read in place
        unless = (model_part.SEQUENCER_FILENAME, *layouts.LAYOUT_MARKERS.values())
        loaded = load_folder_in_place(
            os.fspath(path),
            unless=unless,
            compile=compile,
            custom_objects=custom_objects,
            safe_mode=safe_mode,
            modules=modules,
        )
        if loaded is not None:
            return loaded
    # Any other deduplicated checkpoint folder in its store is assembled (verified) to a
    # temporary one.
    with readable_folder(os.fspath(path)) as folder:
        return _load_from_folder(
            folder, model, compile, custom_objects, safe_mode, trust_pickle, trust_code, modules
        )


def _load_from_folder(
    folder: str,
    model: KerasModel | None,
    compile: bool,
    custom_objects: Mapping[str, Any] | None,
    safe_mode: bool,
    trust_pickle: bool,
    trust_code: bool,
    modules: Sequence[str],
) -> Any:
    """:func:`load_model_from_checkpoint_path` on a folder holding the checkpoint's files."""
    trial_ckpt = os.path.isfile(os.path.join(folder, model_part.SEQUENCER_FILENAME))
    if trial_ckpt and (model is not None or model_part.weights_only_trial_checkpoint(folder)):
        # a ckptstore TFKerasTrial checkpoint: into the caller's model, or the one its trial
        # class builds (Keras 2 keeps a subclassed model's weights only)
        if model is None:
            model = model_part.build_trial_model(folder, modules)
        return model_part.load_into(model, folder)
    layout = layouts.detect_layout(os.listdir(folder)) if os.path.isdir(folder) else None
    if layout == layouts.CALLBACK and model is None and _holds_its_keras2_model(folder):
        layout = None  # ckptstore's own Keras 2 checkpoint: loaded like any ckptstore one
    if layout is None:
        if model is not None:
            raise errors.InvalidConfig(
                f"model= is for Determined checkpoints; {folder} is a ckptstore checkpoint, "
                "which holds its model. Received: model=" + type(model).__name__ + "."
            )
        return load_model_from_folder(
            folder,
            compile=compile,
            custom_objects=custom_objects,
            safe_mode=safe_mode,
            modules=modules,
        )
    if model is None:
        model = build_trial_model(folder, trust_code=trust_code)
    if model is None and layout in layouts.H5_LAYOUTS:
        # A whole Keras 2 HDF5 model: Keras 3 reads the architecture itself.
        return load_h5_model(os.path.join(folder, layouts.LAYOUT_MARKERS[layout]), custom_objects)
    if model is None:
        raise errors.ModelLoadError(
            f"{folder} is a Determined {layout} checkpoint with weights only and no trial code "
            "(code/ with load_data.json) to build the model from. Build the model with your "
            "code and pass it: load_model_from_checkpoint_path(path, model=model)."
        )
    optimizer_built = getattr(model, "optimizer", None) is not None
    load_determined_checkpoint(
        model, folder, trust_pickle=trust_pickle, load_optimizer=optimizer_built
    )
    return model


__all__ = [
    "build_trial_model",
    "load_h5_model",
    "load_model_from_checkpoint_path",
    "trial_spec",
]
