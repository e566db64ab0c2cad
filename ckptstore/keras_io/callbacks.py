"""Keras callbacks whose state survives a pause and resume.

:class:`Callback` is ``keras.callbacks.Callback`` plus three hooks that
:class:`~ckptstore.keras_io.callback.DeterminedCallback` calls: ``get_state()`` (a JSON-able
value saved in every checkpoint's ``callback_state.json``), ``load_state(state)`` (called on an
exact resume, after every callback's ``on_train_begin`` and before the first epoch starts) and
``on_checkpoint_end(checkpoint_dir)`` (add your own files to a checkpoint). Any callback in the
``fit()`` list with ``get_state``/``load_state`` takes part, not only subclasses of this one.

:class:`EarlyStopping` and :class:`ReduceLROnPlateau` are Keras's callbacks made stateful: best
value, wait and cooldown counters survive a resume (the learning rate itself lives in the
optimizer, which the checkpoint restores). ``EarlyStopping``'s ``best_weights`` are not kept;
after a resume with ``restore_best_weights=True`` the next epoch's weights start the tally again.

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

import math
from typing import Any

import keras


def _jsonable_number(value: Any) -> Any:
    if value is None:
        return None
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    return value


def _number_from_json(value: Any) -> Any:
    if isinstance(value, str):
        return float(value)
    return value


class Callback(keras.callbacks.Callback):
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


class EarlyStopping(keras.callbacks.EarlyStopping, Callback):
    """``keras.callbacks.EarlyStopping`` whose best value and wait counter survive a resume.

    Takes exactly Keras's arguments.

    Example::

        stop = ckptstore.keras.EarlyStopping(monitor="val_loss", patience=3)
        model.fit(x, y, validation_data=(vx, vy), callbacks=[det_cb, stop])
    """

    def get_state(self) -> dict[str, Any]:
        return {
            "wait": int(self.wait),
            "stopped_epoch": int(self.stopped_epoch),
            "best": _jsonable_number(getattr(self, "best", None)),
            "best_epoch": int(getattr(self, "best_epoch", 0)),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.wait = int(state.get("wait", 0))
        self.stopped_epoch = int(state.get("stopped_epoch", 0))
        self.best = _number_from_json(state.get("best"))
        self.best_epoch = int(state.get("best_epoch", 0))


class ReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau, Callback):
    """``keras.callbacks.ReduceLROnPlateau`` whose best value, wait and cooldown counters
    survive a resume (the reduced learning rate is restored with the optimizer).

    Takes exactly Keras's arguments.

    Example::

        lr = ckptstore.keras.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2)
    """

    def get_state(self) -> dict[str, Any]:
        return {
            "wait": int(self.wait),
            "cooldown_counter": int(self.cooldown_counter),
            "best": _jsonable_number(getattr(self, "best", None)),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.wait = int(state.get("wait", 0))
        self.cooldown_counter = int(state.get("cooldown_counter", 0))
        self.best = _number_from_json(state.get("best"))
