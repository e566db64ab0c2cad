"""Keras callbacks whose state survives a pause and resume.

:class:`Callback` (public as ``ckptstore.keras.Callback`` and ``ckptstore.keras.callbacks.Callback``)
is ``keras.callbacks.Callback`` plus three hooks that
:class:`~ckptstore.keras_io.fit._callback.DeterminedCallback` calls: ``get_state()`` (a JSON-able
value saved in every checkpoint's ``callback_state.json``), ``load_state(state)`` (called on an
exact resume, after every callback's ``on_train_begin`` and before the first epoch starts) and
``on_checkpoint_end(checkpoint_dir)`` (add your own files to a checkpoint). Any callback in the
``fit()`` list with ``get_state``/``load_state`` takes part, not only subclasses of this one.

:class:`EarlyStopping` and :class:`ReduceLROnPlateau` are Keras's callbacks made stateful: best
value, wait and cooldown counters survive a resume (the learning rate itself lives in the
optimizer, which the checkpoint restores), and so do ``EarlyStopping``'s ``best_weights`` (saved
beside the state as ``callback_arrays.npz``). Keras's own callbacks of these names (and
``History``, ``ModelCheckpoint``) are carried too, through adapters. Like Determined's, both count
the validation passes they have seen in ``test_end_count`` (saved in their state); unlike
Determined's (which check at ``on_test_end`` under TFKerasTrial), they check at ``on_epoch_end``,
where ``fit()`` gives them the ``val_`` metrics.

Example::

    import ckptstore as det

    class CountEpochs(det.keras.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = 0

        def on_epoch_end(self, epoch, logs=None):
            self.epochs += 1

        def get_state(self):
            return {"epochs": self.epochs}

        def load_state(self, state):
            self.epochs = state["epochs"]
"""

from __future__ import annotations

from typing import Any

from ckptstore.keras_io.backend import CallbackBase, keras
from ckptstore.keras_io.fit._keras_callback_state import keras_state, load_keras_state


class Callback(CallbackBase):
    """A Keras callback with checkpointable state.

    Override ``get_state``/``load_state`` to keep state across a resume; the state must be
    JSON-able. ``on_checkpoint_end(checkpoint_dir)`` runs on the chief after the checkpoint's
    files are written and before they are uploaded; files it adds are part of the checkpoint.

    Example::

        class MyCallback(ckptstore.keras.Callback):
            def get_state(self):
                return {"seen": self.seen}

            def load_state(self, state):
                self.seen = state["seen"]
    """

    def get_state(self) -> Any:
        """A JSON-able value with this callback's state (default: None)."""
        return None

    def load_state(self, state: Any) -> None:
        """Restore what :meth:`get_state` returned."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Called with the local folder of a checkpoint being written."""

    # TFKerasTrial's workload hooks (Determined's ``det.keras.callbacks.Callback``): the trial
    # controller calls them around every chunk of training; plain ``fit()`` never does.
    def on_train_workload_begin(
        self, total_batches_trained: int, batches_requested: int | None, logs: dict[str, Any]
    ) -> None:
        """Called before a chunk of training of ``batches_requested`` batches."""

    def on_train_workload_end(self, total_batches_trained: int, logs: dict[str, Any]) -> None:
        """Called after a chunk of training; ``logs`` holds its averaged training metrics."""


class _KerasStateCounted:
    """The state of a stateful Keras callback (its counters and best value; ``best_weights``
    are arrays, which DeterminedCallback stores in ``callback_arrays.npz``), plus Determined's
    ``test_end_count``: validation passes seen (``on_test_end`` calls)."""

    test_end_count = 0

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_test_end(logs)  # type: ignore[misc]
        self.test_end_count += 1

    def get_state(self) -> dict[str, Any]:
        return {**keras_state(self), "test_end_count": int(self.test_end_count)}

    def load_state(self, state: dict[str, Any]) -> None:
        load_keras_state(self, state)
        self.test_end_count = int(state.get("test_end_count", 0))


class EarlyStopping(_KerasStateCounted, keras.callbacks.EarlyStopping, Callback):
    """``keras.callbacks.EarlyStopping`` whose best value, wait counter and ``best_weights``
    survive a resume.

    Takes exactly Keras's arguments.

    Example::

        stop = ckptstore.keras.EarlyStopping(monitor="val_loss", patience=3)
        model.fit(x, y, validation_data=(vx, vy), callbacks=[det_cb, stop])
    """


class ReduceLROnPlateau(_KerasStateCounted, keras.callbacks.ReduceLROnPlateau, Callback):
    """``keras.callbacks.ReduceLROnPlateau`` whose best value, wait and cooldown counters
    survive a resume (the reduced learning rate is restored with the optimizer).

    Takes exactly Keras's arguments.

    Example::

        lr = ckptstore.keras.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2)
    """


#: Determined's name for the stateful ReduceLROnPlateau (``det.keras.callbacks.ReduceLRScheduler``).
ReduceLRScheduler = ReduceLROnPlateau
