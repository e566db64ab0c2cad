"""Determined's ``determined.keras`` API on ckptstore: ``import ckptstore as det; det.keras...``.

A facade: the code lives in :mod:`ckptstore.keras_io`. Importing this module imports Keras.

Example::

    import ckptstore as det

    with det.core.init(storage="/tmp/ckpts", trial_id=1) as core_context:
        det_cb = det.keras.DeterminedCallback(
            core_context,
            checkpoint=core_context.info.latest_checkpoint,
            continue_id=core_context.info.trial.trial_id,
        )
        model.fit(x, y, epochs=5, validation_data=(vx, vy), callbacks=[det_cb])
"""

from __future__ import annotations

import sys as _sys

from ckptstore.keras_io.callback import DeterminedCallback
from ckptstore.keras_io.callbacks import Callback, EarlyStopping, ReduceLROnPlateau
from ckptstore.keras_io.determined_weights import load_determined_checkpoint
from ckptstore.keras_io.keras_context import KerasContext, init
from ckptstore.keras_io.loaders import load_checkpoint_model, load_model_from_checkpoint_path
from ckptstore.keras_io.tensorboard import TensorBoard
from ckptstore.keras_io.trial import (
    InMemorySequence,
    SequenceAdapter,
    TFKerasExperimentalContext,
    TFKerasTrial,
    TFKerasTrialContext,
    callbacks,  # ckptstore.keras.callbacks.Callback (issue 5)
)

_sys.modules.setdefault(__name__ + ".callbacks", callbacks)

__all__ = [
    "Callback",
    "DeterminedCallback",
    "EarlyStopping",
    "KerasContext",
    "ReduceLROnPlateau",
    "TensorBoard",
    "InMemorySequence",
    "SequenceAdapter",
    "TFKerasExperimentalContext",
    "TFKerasTrial",
    "TFKerasTrialContext",
    "callbacks",
    "init",
    "load_checkpoint_model",
    "load_determined_checkpoint",
    "load_model_from_checkpoint_path",
]
