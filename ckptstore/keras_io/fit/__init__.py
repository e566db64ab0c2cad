"""What runs inside ``model.fit()``: :class:`DeterminedCallback` (checkpoints, exact resume,
metrics, preemption), the training state a checkpoint keeps besides the model
(``callback_state.json``: RNG, extra variables, Keras's own callbacks' state), the stateful
callbacks users subclass, :class:`TensorBoard` synced to storage, and the multi-worker ``fit()``
patch for Keras 3.

Example::

    from ckptstore.keras_io.fit import DeterminedCallback

    model.fit(x, y, epochs=5, callbacks=[DeterminedCallback(core_context, None, 1)])
"""

from ckptstore.keras_io.fit._callback import DeterminedCallback
from ckptstore.keras_io.fit._callback_state import get_rng_state, set_rng_state
from ckptstore.keras_io.fit._stateful import (
    Callback,
    EarlyStopping,
    ReduceLROnPlateau,
    ReduceLRScheduler,
)
from ckptstore.keras_io.fit._tensorboard import TensorBoard, TrialTensorBoard

__all__ = [
    "Callback",
    "DeterminedCallback",
    "EarlyStopping",
    "ReduceLROnPlateau",
    "ReduceLRScheduler",
    "TensorBoard",
    "TrialTensorBoard",
    "get_rng_state",
    "set_rng_state",
]
