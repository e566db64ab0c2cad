"""What ``TFKerasTrial.build_model()`` returned, checked before training: a compiled
``keras.Model`` of the running Keras, compiled the way that Keras reads its arguments.

A Determined model_def written for Keras 2 compiles with ``model.compile(optimizer, loss,
[metrics])`` (its iris example does). Keras 3 reads the third positional argument as
``loss_weights``, accepts the list, and fails at the first batch deep inside Keras
(``TypeError: Failed to convert elements of <function categorical_accuracy ...> to Tensor``);
:func:`check_built_model` says what to change before anything trains.

Example::

    model = trial.build_model()
    check_built_model(model)   # InvalidConfig naming the fix, or nothing
"""

from __future__ import annotations

import numbers
from typing import Any

from ckptstore import errors
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.backend import keras


def _is_compiled(model: KerasModel) -> bool:
    """``model.compiled`` (Keras 3) / ``model._is_compiled`` (Keras 2)."""
    return bool(getattr(model, "compiled", False) or getattr(model, "_is_compiled", False))


def _loss_weights(model: KerasModel) -> list[Any]:
    """The ``loss_weights`` Keras 3 recorded at compile, flattened (``[]`` on Keras 2 or when
    none were given)."""
    given = getattr(getattr(model, "_compile_loss", None), "_user_loss_weights", None)
    if isinstance(given, dict):
        return list(given.values())
    if isinstance(given, (list, tuple)):
        return list(given)
    return [] if given is None else [given]


def check_built_model(model: Any) -> None:
    """:class:`~ckptstore.errors.InvalidConfig` unless ``model`` is a compiled ``keras.Model``
    whose ``loss_weights`` (Keras 3) are numbers."""
    backend.check_model(model, what="TFKerasTrial")
    if not isinstance(model, keras.Model):
        raise errors.InvalidConfig(
            f"build_model() must return a compiled keras.Model; it returned a "
            f"{type(model).__name__}."
        )
    if not _is_compiled(model) or getattr(model, "optimizer", None) is None:
        raise errors.InvalidConfig(
            "build_model() returned a model that is not compiled. Call "
            "model.compile(optimizer=..., loss=...) before returning it."
        )
    odd = [w for w in _loss_weights(model) if not isinstance(w, numbers.Number)]
    if odd and not backend.IS_KERAS2:
        raise errors.InvalidConfig(
            "build_model() compiled the model with loss_weights that are not numbers "
            f"({odd[0]!r}): on Keras 3 the third positional argument of model.compile() is "
            "loss_weights, where Keras 2 had metrics. Pass metrics by name "
            "(model.compile(optimizer, loss, metrics=[...])), or run the trial on Keras 2 "
            "(pip install tf_keras; TF_USE_LEGACY_KERAS=1)."
        )


__all__ = ["check_built_model"]
