"""``ckptstore.keras.callbacks``: Determined's ``determined.keras.callbacks`` namespace.

:class:`Callback` is ``ckptstore.keras.Callback`` (``get_state``/``load_state``,
``on_checkpoint_end``) plus the TFKerasTrial workload hooks ``on_train_workload_begin`` and
``on_train_workload_end``. The trial controller calls them around every chunk of training.

Example::

    from ckptstore.keras import callbacks

    class CountBatches(callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = 0

        def on_train_workload_end(self, total_batches_trained, logs):
            self.seen = total_batches_trained

        def get_state(self):
            return {"seen": self.seen}

        def load_state(self, state):
            self.seen = state["seen"]
"""

from __future__ import annotations

from typing import Any

from ckptstore.keras_io import callbacks as _base
from ckptstore.keras_io.callbacks import EarlyStopping, ReduceLROnPlateau


class Callback(_base.Callback):
    """A Keras callback with state that survives resumes and the TFKerasTrial workload hooks."""

    def on_train_workload_begin(
        self, total_batches_trained: int, batches_requested: int | None, logs: dict[str, Any]
    ) -> None:
        """Called before a chunk of training of ``batches_requested`` batches."""

    def on_train_workload_end(self, total_batches_trained: int, logs: dict[str, Any]) -> None:
        """Called after a chunk of training; ``logs`` holds its averaged training metrics."""


#: Determined's name for the stateful ReduceLROnPlateau.
ReduceLRScheduler = ReduceLROnPlateau

__all__ = ["Callback", "EarlyStopping", "ReduceLROnPlateau", "ReduceLRScheduler"]
