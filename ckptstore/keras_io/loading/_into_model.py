"""Loading a checkpoint into a model the caller built (``load_checkpoint_model(...,
model=...)``): the weights, and the optimizer state when the model is compiled, of any
checkpoint of either Keras version — the way to load a weights-only checkpoint (a model whose
config could not be saved, a Keras 2 subclassed model). Nothing the checkpoint names is
imported: the caller's code built the model.

Example::

    model = load_into_model(build_model, "/tmp/ckpt-folder", "0b7c...")
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _optimizers as optimizers_lib
from ckptstore.keras_io.saving import _weights_view as weights_view
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME


def load_into_model(
    model: KerasModel | Callable[[], KerasModel], path: str, uuid: str
) -> KerasModel:
    """Load checkpoint folder ``path`` (of checkpoint ``uuid``) into ``model`` (or the model
    ``model()`` returns) and return it; ModelLoadError when it does not fit."""
    from ckptstore.keras_io import backend

    if not hasattr(model, "load_weights") and callable(model):
        model = model()
    if not hasattr(model, "load_weights"):
        raise errors.ModelLoadError(
            f"model= must be a Keras model or a function returning one. Received: {model!r}"
        )
    keras_file = os.path.join(path, MODEL_FILENAME)
    optimizer = getattr(model, "optimizer", None) is not None
    try:
        if os.path.isfile(keras_file) and not backend.IS_KERAS2:
            _load_keras_file_weights(model, keras_file)
        elif keras2_format.has_weights(path):
            if optimizer:  # Keras 2.11+ makes slots lazily: made now, the restore fills them
                keras2_format.build_optimizer(model)
            keras2_format.load_into(model, path, with_optimizer=optimizer)
        else:
            raise errors.ModelLoadError(
                f"Checkpoint {uuid} holds no weights this Keras can read into a model "
                f"(files: {sorted(os.listdir(path))[:10]}; a Keras 3 model.keras needs Keras 3)."
            )
    except errors.ResumeError as exc:
        raise errors.ModelLoadError(f"Checkpoint {uuid} into model=: {exc}") from exc
    return model


def _load_keras_file_weights(model: KerasModel, keras_file: str) -> None:
    """Weights (and a compiled model's optimizer state) from a Keras 3 ``model.keras``;
    Keras's own mismatch warnings are raised as ModelLoadError (a silent partial load would
    hand back an untrained model)."""
    keras2_format.build_optimizer(model)
    # a GAN's own optimizers, built as when it was saved, so that their slots load
    optimizers_lib.build_attribute_optimizers(model, os.path.dirname(keras_file))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            weights_view.load_weights(model, keras_file)  # never through the zip reader
        except (ValueError, KeyError, OSError) as exc:
            raise errors.ModelLoadError(
                f"Could not load {keras_file} into model=: {exc}. The model (layers, shapes, "
                "optimizer) must be the one the checkpoint was saved from; build a subclassed "
                "model (call it on a batch) before loading."
            ) from exc
    raise_partial_load(
        caught,
        lambda text: errors.ModelLoadError(
            f"{keras_file} does not fit model=: {text} Build the model as it was saved (and "
            "compile it with the same optimizer, or not at all)."
        ),
    )
    optimizers_lib.raise_if_unrestored(model, keras_file)


def raise_partial_load(
    caught: list[warnings.WarningMessage], error: Callable[[str], Exception]
) -> None:
    """Keras 3 reports a partial ``load_weights`` (variables skipped, shapes that do not match)
    only as a warning: raise ``error(text)`` for one, and re-issue the other warnings."""
    for w in caught:
        text = str(w.message)
        if "Skipping variable loading" in text or "mismatch" in text.lower():
            raise error(text.strip())
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
