"""Determined's TFKerasTrial API on ckptstore: the trial class, its context, data helpers and the
controller that trains in batches, validates, checkpoints and resumes — on the Keras ``tf.keras``
is: Keras 3, or Keras 2 (tf_keras, legacy optimizers included) with ``TF_USE_LEGACY_KERAS=1``.

Example::

    from ckptstore.keras import InMemorySequence, TFKerasTrial, TFKerasTrialContext
"""

from ckptstore.keras_io.trial.context import TFKerasExperimentalContext, TFKerasTrialContext
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.keras_io.trial.sequences import (
    ArrayLike,
    InMemorySequence,
    InputData,
    SequenceAdapter,
)
from ckptstore.keras_io.trial.trial import TFKerasTrial

# Determined's TFKerasTrial.trial_controller_class. Wired here, where both classes are public,
# because the controller module imports trial.py (trial.py cannot name it without a cycle).
TFKerasTrial.trial_controller_class = TrialController

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
