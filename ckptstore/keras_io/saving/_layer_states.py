"""State Keras keeps outside a model's weights: the carried states of stateful RNN layers.

A ``stateful=True`` RNN (``LSTM``, ``GRU``, ``SimpleRNN``, ``ConvLSTM*``, each direction of a
``Bidirectional``) carries its last states into the next batch. Neither Keras saves them:
Keras 3 creates ``RNN.states`` as untracked variables, Keras 2 keeps them out of the model's
checkpointed weights. A resumed run would continue its epoch from zero states while an
uninterrupted one continues from the carried ones, so checkpoints hold them too (in
``callback_state.json``'s ``layer_states``, their arrays in ``callback_arrays.npz``) and a
resume puts them back through Keras's own API: ``layer.states`` to read, Keras 2's
``layer.reset_states(states=...)`` to set (Keras 3's ``reset_state()`` takes no values, so each
of its ``states`` variables is assigned, as ``reset_state()`` itself does).

Layers are matched by their position among the model's stateful RNN layers (names differ
between processes that built other models first), and each by name in messages.

Example::

    saved = capture(model)           # [{"layer": "lstm", "states": [h, c]}]
    restore(model, saved, "ckpt-uuid")
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel


def stateful_rnns(model: KerasModel) -> list[Any]:
    """The model's stateful RNN layers, nested ones included, in the model's layer order."""
    keras = backend.keras
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=False, recursive=True)) if flatten else []
    return [
        layer
        for layer in layers
        if isinstance(layer, keras.layers.RNN) and getattr(layer, "stateful", False)
    ]


def _values(layer: Any) -> list[np.ndarray] | None:
    states = getattr(layer, "states", None)
    if not states or any(s is None for s in states):
        return None  # not built yet: nothing carried
    return [np.array(s.numpy()) for s in states]


def capture(model: KerasModel) -> list[dict[str, Any]]:
    """``[{"layer": name, "states": [arrays] or None}]`` for every stateful RNN layer."""
    return [{"layer": layer.name, "states": _values(layer)} for layer in stateful_rnns(model)]


def restore(model: KerasModel, saved: list[dict[str, Any]] | None, uuid: str) -> None:
    """Put back what :func:`capture` recorded. A checkpoint of another set of stateful layers,
    or states of other shapes (another batch size), is a ResumeError: an exact resume cannot
    continue from them."""
    if not saved:
        return
    layers = stateful_rnns(model)
    if len(layers) != len(saved):
        raise errors.ResumeError(
            f"Checkpoint {uuid} holds the carried states of {len(saved)} stateful RNN layers; "
            f"this model has {len(layers)} "
            f"({[layer.name for layer in layers]}). Resume with the model that wrote it."
        )
    for layer, item in zip(layers, saved, strict=True):
        values = item.get("states") if isinstance(item, dict) else item
        if values is None:
            continue
        if not isinstance(values, list) or not all(isinstance(v, np.ndarray) for v in values):
            raise errors.InvalidCheckpoint(
                f"Checkpoint {uuid}: the saved states of stateful RNN layer {layer.name!r} are "
                "not arrays in callback_arrays.npz; the checkpoint is damaged. Resume from "
                "another checkpoint."
            )
        current = _values(layer)
        shapes = [tuple(np.shape(v)) for v in values]
        if current is None or shapes != [v.shape for v in current]:
            raise errors.ResumeError(
                f"Checkpoint {uuid} holds states of shapes {shapes} for stateful RNN layer "
                f"{layer.name!r}; the model's are "
                f"{None if current is None else [v.shape for v in current]}. A stateful RNN "
                "resumes with the batch size it was trained with (its Input's batch_shape)."
            )
        if backend.IS_KERAS2:
            typed = [np.asarray(v, c.dtype) for v, c in zip(values, current, strict=True)]
            layer.reset_states(states=typed)  # Keras 2's own setter checks shapes again
        else:
            for variable, value, now in zip(layer.states, values, current, strict=True):
                variable.assign(np.asarray(value, dtype=now.dtype))


__all__ = ["capture", "restore", "stateful_rnns"]
