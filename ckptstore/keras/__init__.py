"""Determined's ``determined.keras`` API on ckptstore: ``import ckptstore as det; det.keras...``.

The public list of names; the code lives in :mod:`ckptstore.keras_io` (Keras integration) and
:mod:`ckptstore.import_determined`. Importing this module imports Keras.

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

import warnings
from typing import TYPE_CHECKING, Any

from ckptstore.import_determined.weights import load_determined_checkpoint
from ckptstore.keras import callbacks
from ckptstore.keras._load import load_model_from_checkpoint_path
from ckptstore.keras_io.context import KerasContext, init
from ckptstore.keras_io.exporting import ExportPolicy, export_checkpoint
from ckptstore.keras_io.fit import (
    Callback,
    DeterminedCallback,
    EarlyStopping,
    ReduceLROnPlateau,
    TensorBoard,
    TrialTensorBoard,
    get_rng_state,
    set_rng_state,
)
from ckptstore.keras_io.loading import load_checkpoint_model
from ckptstore.keras_io.trial import (
    SEQUENCE_NAMES,
    TFKerasExperimentalContext,
    TFKerasTrial,
    TFKerasTrialContext,
)

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.keras_io.trial.sequences import (
        ArrayLike,
        InMemorySequence,
        InputData,
        SequenceAdapter,
    )


def __getattr__(name: str) -> Any:
    # TFKerasTrial's data helpers import TensorFlow: loaded on first use, so that this module
    # imports on JAX or PyTorch without TensorFlow installed (issue 42).
    if name in SEQUENCE_NAMES:
        from ckptstore.keras_io.trial import sequences

        return getattr(sequences, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TFKerasTensorBoard(TrialTensorBoard):
    """Determined's deprecated name for :class:`ckptstore.keras.callbacks.TensorBoard` (warns
    with a ``FutureWarning``, as Determined 0.38 does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            "det.keras.TFKerasTensorBoard is a deprecated name for "
            "det.keras.callbacks.TensorBoard; use that name.",
            FutureWarning,
            stacklevel=2,
        )
        super().__init__(*args, **kwargs)


__all__ = [
    "ArrayLike",
    "Callback",
    "DeterminedCallback",
    "EarlyStopping",
    "ExportPolicy",
    "InMemorySequence",
    "InputData",
    "KerasContext",
    "ReduceLROnPlateau",
    "SequenceAdapter",
    "TFKerasExperimentalContext",
    "TFKerasTensorBoard",
    "TFKerasTrial",
    "TFKerasTrialContext",
    "TensorBoard",
    "callbacks",
    "export_checkpoint",
    "get_rng_state",
    "init",
    "load_checkpoint_model",
    "load_determined_checkpoint",
    "load_model_from_checkpoint_path",
    "set_rng_state",
]
