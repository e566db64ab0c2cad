"""``ckptstore.keras.callbacks``: Determined's ``determined.keras.callbacks`` namespace.

``TensorBoard`` here is the one for ``TFKerasTrial.keras_callbacks()`` (no core context; its
folder is synced to storage by the trial controller), as in Determined; with ``model.fit()`` use
``ckptstore.keras.TensorBoard(core_context, ...)``.

One class per name: ``ckptstore.keras.callbacks.Callback`` *is* ``ckptstore.keras.Callback``
(state across resumes, ``on_checkpoint_end``, and TFKerasTrial's ``on_train_workload_begin`` /
``on_train_workload_end`` hooks).

Example::

    from ckptstore.keras import callbacks

    class CountBatches(callbacks.Callback):
        def on_train_workload_end(self, total_batches_trained, logs):
            self.seen = total_batches_trained

        def get_state(self):
            return {"seen": self.seen}

        def load_state(self, state):
            self.seen = state["seen"]
"""

from __future__ import annotations

from ckptstore.keras_io.fit import (
    Callback,
    EarlyStopping,
    ReduceLROnPlateau,
    ReduceLRScheduler,
)
from ckptstore.keras_io.fit import TrialTensorBoard as TensorBoard

__all__ = ["Callback", "EarlyStopping", "ReduceLROnPlateau", "ReduceLRScheduler", "TensorBoard"]
