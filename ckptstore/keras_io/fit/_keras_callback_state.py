"""State of Keras's own callbacks across a resume, and arrays in callback states.

Keras's ``History``, ``EarlyStopping`` (with ``best_weights``), ``ReduceLROnPlateau`` and
``ModelCheckpoint`` have no ``get_state``/``load_state``; :func:`with_state` gives each a small
adapter that has them, so :class:`~ckptstore.keras_io.fit._callback.DeterminedCallback`
carries their counters, best values and the metrics history over a resume like any stateful
callback's. A state may hold NumPy arrays (e.g. ``best_weights``): :func:`split_arrays` moves them
into a ``.npz`` file beside ``callback_state.json`` (never pickle) and :func:`join_arrays` puts
them back.

Example::

    adapter = with_state(keras.callbacks.History())
    saved = adapter.get_state()      # {"epoch": [...], "history": {...}}
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_io.backend import keras

#: File of the arrays in callback states inside a checkpoint.
ARRAYS_FILENAME = "callback_arrays.npz"
_ARRAY_KEY = "__ndarray__"


def _num(value: Any) -> Any:
    if value is None:
        return None
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    return value


def _from_num(value: Any) -> Any:
    return float(value) if isinstance(value, str) else value


def _weights(values: Any) -> Any:
    return None if values is None else [np.asarray(v) for v in values]


class _Adapter:
    """``get_state``/``load_state`` for a callback that has neither."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback


class _History(_Adapter):
    def get_state(self) -> dict[str, Any]:
        cb = self.callback
        history = {
            key: [v if isinstance(v, (int, str)) else _num(v) for v in values]
            for key, values in getattr(cb, "history", {}).items()
        }
        return {"epoch": [int(e) for e in getattr(cb, "epoch", [])], "history": history}

    def load_state(self, state: dict[str, Any]) -> None:
        self.callback.epoch = list(state.get("epoch", []))
        self.callback.history = {
            key: [_from_num(v) for v in values] for key, values in state.get("history", {}).items()
        }


class _EarlyStopping(_Adapter):
    def get_state(self) -> dict[str, Any]:
        cb = self.callback
        return {
            "wait": int(cb.wait),
            "stopped_epoch": int(cb.stopped_epoch),
            "best": _num(getattr(cb, "best", None)),
            "best_epoch": int(getattr(cb, "best_epoch", 0)),
            "best_weights": _weights(getattr(cb, "best_weights", None)),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        cb = self.callback
        cb.wait = int(state.get("wait", 0))
        cb.stopped_epoch = int(state.get("stopped_epoch", 0))
        cb.best = _from_num(state.get("best"))
        cb.best_epoch = int(state.get("best_epoch", 0))
        if "best_weights" in state:
            cb.best_weights = _weights(state["best_weights"])


class _ReduceLROnPlateau(_Adapter):
    def get_state(self) -> dict[str, Any]:
        cb = self.callback
        return {
            "wait": int(cb.wait),
            "cooldown_counter": int(cb.cooldown_counter),
            "best": _num(getattr(cb, "best", None)),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        cb = self.callback
        cb.wait = int(state.get("wait", 0))
        cb.cooldown_counter = int(state.get("cooldown_counter", 0))
        cb.best = _from_num(state.get("best"))


class _ModelCheckpoint(_Adapter):
    def get_state(self) -> dict[str, Any]:
        cb = self.callback
        last = getattr(cb, "_last_batch_seen", None)
        return {
            "best": _num(getattr(cb, "best", None)),
            "batches_since_save": int(getattr(cb, "_batches_seen_since_last_saving", 0)),
            "last_batch_seen": None if last is None else int(last),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        cb = self.callback
        cb.best = _from_num(state.get("best"))
        cb._batches_seen_since_last_saving = int(state.get("batches_since_save", 0))
        cb._last_batch_seen = state.get("last_batch_seen")


_ADAPTERS: tuple[tuple[type, type[_Adapter]], ...] = (
    (keras.callbacks.History, _History),
    (keras.callbacks.EarlyStopping, _EarlyStopping),
    (keras.callbacks.ReduceLROnPlateau, _ReduceLROnPlateau),
    (keras.callbacks.ModelCheckpoint, _ModelCheckpoint),
)


def _adapter(callback: Any) -> _Adapter:
    for cls, adapter in _ADAPTERS:
        if isinstance(callback, cls):
            return adapter(callback)
    raise TypeError(f"No state adapter for {type(callback).__name__}")


def keras_state(callback: Any) -> Any:
    """The state of one of Keras's stateful callbacks (or a subclass), as JSON + arrays."""
    return _adapter(callback).get_state()


def load_keras_state(callback: Any, state: Any) -> None:
    """Put back what :func:`keras_state` returned."""
    _adapter(callback).load_state(state)


def with_state(callback: Any) -> Any:
    """``callback`` itself when it has ``get_state``/``load_state``, an adapter for Keras's
    stateful callbacks, else None."""
    if callable(getattr(callback, "get_state", None)) and callable(
        getattr(callback, "load_state", None)
    ):
        return callback
    for cls, adapter in _ADAPTERS:
        if isinstance(callback, cls):
            return adapter(callback)
    return None


# ---- arrays in states ----------------------------------------------------------------------------
def split_arrays(value: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``value`` with every NumPy array replaced by ``{"__ndarray__": "a<n>"}``, and the arrays."""
    arrays: dict[str, np.ndarray] = {}

    def walk(item: Any) -> Any:
        if isinstance(item, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = item
            return {_ARRAY_KEY: key}
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        return item

    return walk(value), arrays


def join_arrays(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Undo :func:`split_arrays`."""
    if isinstance(value, dict):
        if set(value) == {_ARRAY_KEY}:
            key = value[_ARRAY_KEY]
            if key not in arrays:
                raise errors.InvalidCheckpoint(
                    f"{ARRAYS_FILENAME} has no array {key!r} that callback_state.json refers "
                    "to; the checkpoint is damaged. Resume from another checkpoint."
                )
            return arrays[key]
        return {k: join_arrays(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [join_arrays(v, arrays) for v in value]
    return value


def arrays_to_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def arrays_from_file(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise errors.InvalidCheckpoint(
            f"{ARRAYS_FILENAME} could not be read ({exc}); the checkpoint is damaged. Resume "
            "from another checkpoint."
        ) from exc


__all__ = [
    "ARRAYS_FILENAME",
    "arrays_from_file",
    "arrays_to_bytes",
    "join_arrays",
    "keras_state",
    "load_keras_state",
    "split_arrays",
    "with_state",
]
