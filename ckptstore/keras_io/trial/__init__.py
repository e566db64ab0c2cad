"""Determined's TFKerasTrial API on ckptstore: the trial class, its context, data helpers and the
controller that trains in batches, validates, checkpoints and resumes — on the Keras ``tf.keras``
is: Keras 3, or Keras 2 (tf_keras, legacy optimizers included) with ``TF_USE_LEGACY_KERAS=1``.

Example::

    from ckptstore.keras import InMemorySequence, TFKerasTrial, TFKerasTrialContext
"""

from typing import TYPE_CHECKING, Any

from ckptstore.keras_io.trial.context import TFKerasExperimentalContext, TFKerasTrialContext
from ckptstore.keras_io.trial.trial import TFKerasTrial

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.keras_io.trial.controller import TrialController
    from ckptstore.keras_io.trial.sequences import (
        ArrayLike,
        InMemorySequence,
        InputData,
        SequenceAdapter,
    )

#: Names whose module imports TensorFlow: loaded on first use, so that `import ckptstore.keras`
#: works on Keras 3 with JAX or PyTorch where TensorFlow is not installed (issue 42).
SEQUENCE_NAMES = ("ArrayLike", "InMemorySequence", "InputData", "SequenceAdapter")


def __getattr__(name: str) -> Any:
    # The controller imports the experiment config (pydantic): `import ckptstore.keras` for a
    # DeterminedCallback resume must not pay for it (issue 41), so it loads on first use.
    if name == "TrialController":
        from ckptstore.keras_io.trial.controller import TrialController

        return TrialController
    if name in SEQUENCE_NAMES:
        from ckptstore.keras_io.trial import sequences

        return getattr(sequences, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _ControllerClass:
    """Reads as :class:`~.controller.TrialController`, imported on first read (a subclass may
    still assign its own)."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return __getattr__("TrialController")


# Determined's TFKerasTrial.trial_controller_class. Wired here, where both classes are public,
# because the controller module imports trial.py (trial.py cannot name it without a cycle).
TFKerasTrial.trial_controller_class = _ControllerClass()


__all__ = [
    "ArrayLike",
    "InMemorySequence",
    "InputData",
    "SequenceAdapter",
    "TFKerasExperimentalContext",
    "TFKerasTrial",
    "TFKerasTrialContext",
    "TrialController",
]
