"""Every optimizer of a TFKerasTrial in its checkpoints, each by name.

A trial may train with optimizers that are not ``model.optimizer``: a GAN wraps its generator's
and discriminator's with ``context.wrap_optimizer`` and passes them to its own ``compile()``,
whose ``super().compile()`` leaves Keras's default optimizer unused. ``optimizers.json`` names
each optimizer (``model.optimizer`` under :data:`MODEL_OPTIMIZER`, a wrapped one by the model
attribute that holds it, else ``optimizer-<position>``), whether it was built and for which model
variables (their positions in ``model.weights``); ``optimizers.npz`` holds its variables' values
in order (``iterations``, learning rate, slots). Resuming builds each optimizer for the same
variables, then assigns the values: an optimizer the run never used stays unbuilt, so its absent
state is not an error. Works for Keras 3 optimizers, Keras 2.11+ ones and Keras 2 legacy ones.

Example::

    named = named_optimizers(model, context.optimizers)
    write(folder, model, named)            # into the checkpoint
    record = read(folder)                  # on resume
    build(model, named, record); assign(named, record, folder)
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel

OPTIMIZERS_FILENAME = "optimizers.json"
VALUES_FILENAME = "optimizers.npz"
#: The name ``model.optimizer`` is recorded under.
MODEL_OPTIMIZER = "model.optimizer"


def variables_of(optimizer: Any) -> list[Any]:
    """Every variable of ``optimizer`` (a property on Keras 3 and Keras 2.11+ optimizers, a
    method on Keras 2's legacy ones)."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


def named_optimizers(model: KerasModel, wrapped: list[Any]) -> dict[str, Any]:
    """``model.optimizer`` and every optimizer the trial wrapped, by a name stable across runs:
    the model attribute holding it (a GAN's ``generator_optimizer``), else its position among
    the wrapped ones (``optimizer-1``, as Determined's HDF5 groups). Keras's own optimizer
    names are not stable (``adam_2`` in one process is ``adam_4`` in the next)."""
    named: dict[str, Any] = {}
    model_optimizer = getattr(model, "optimizer", None)
    if model_optimizer is not None:
        named[MODEL_OPTIMIZER] = model_optimizer
    attributes = {
        id(value): key
        for key, value in sorted(vars(model).items())
        if not key.startswith("_") and key != "optimizer"
    }
    for i, optimizer in enumerate(wrapped):
        if any(optimizer is known for known in named.values()):
            continue
        name = attributes.get(id(optimizer)) or f"optimizer-{i}"
        named[name if name not in named else f"optimizer-{i}"] = optimizer
    return named


def _built_for(optimizer: Any, weights: list[Any]) -> list[int] | None:
    """Positions in ``weights`` of the variables ``optimizer`` was built for (None: unbuilt)."""
    trainable = getattr(optimizer, "_trainable_variables", None)  # Keras 3
    if isinstance(trainable, list) and getattr(optimizer, "built", False):
        ids = {id(w): i for i, w in enumerate(weights)}
        return [ids[id(v)] for v in trainable if id(v) in ids]
    key = getattr(optimizer, "_var_key", None)
    index = getattr(optimizer, "_index_dict", None)  # Keras 2.11+ optimizers
    if isinstance(index, dict) and callable(key) and index:
        order = {key(w): i for i, w in enumerate(weights)}
        return [order[k] for k, _ in sorted(index.items(), key=lambda kv: kv[1]) if k in order]
    slots = getattr(optimizer, "_slots", None)  # Keras 2 legacy optimizers
    if isinstance(slots, dict) and callable(key) and slots:
        order = {key(w): i for i, w in enumerate(weights)}
        return [order[k] for k in slots if k in order]
    return None


def write(folder: str, model: KerasModel, named: dict[str, Any]) -> None:
    """Write ``optimizers.json`` and ``optimizers.npz`` into checkpoint ``folder``."""
    weights = list(model.weights)
    record: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for j, (name, optimizer) in enumerate(named.items()):
        built = _built_for(optimizer, weights)
        values = variables_of(optimizer) if built is not None else []
        record[name] = {
            "class": type(optimizer).__name__,
            "built_for": built,
            "count": len(values),
            "key": f"o{j}",
        }
        for i, var in enumerate(values):
            arrays[f"o{j}_{i}"] = np.asarray(var.numpy())
    with open(os.path.join(folder, OPTIMIZERS_FILENAME), "w", encoding="utf-8") as f:
        json.dump(record, f)
    np.savez(os.path.join(folder, VALUES_FILENAME), **arrays)


def read(folder: str) -> dict[str, Any] | None:
    """The ``optimizers.json`` record of a checkpoint (None: written before it existed)."""
    path = os.path.join(folder, OPTIMIZERS_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if not isinstance(record, dict):
        raise errors.InvalidCheckpoint(f"{path} is not a JSON object; the checkpoint is damaged.")
    return record


def _check_names(named: dict[str, Any], record: dict[str, Any], folder: str) -> None:
    if set(named) != set(record):
        raise errors.ResumeError(
            f"The checkpoint in {folder} holds the state of optimizers {sorted(record)}, but "
            f"build_model() made {sorted(named)}. Wrap the same optimizers "
            "(context.wrap_optimizer), in the same order, as the run that wrote it."
        )


def build(model: KerasModel, named: dict[str, Any], record: dict[str, Any], folder: str) -> None:
    """Build each optimizer for the variables it was built for when the checkpoint was
    written, so its variables exist (in the same order) before values are assigned."""
    _check_names(named, record, folder)
    weights = list(model.weights)
    for name, optimizer in named.items():
        positions = record[name].get("built_for")
        if positions is None:
            continue
        var_list = [weights[i] for i in positions]
        create = getattr(optimizer, "_create_all_weights", None)  # Keras 2 legacy
        if callable(create):
            create(var_list)
        elif not getattr(optimizer, "built", False) and not getattr(optimizer, "_index_dict", {}):
            optimizer.build(var_list)


def assign(named: dict[str, Any], record: dict[str, Any], folder: str) -> None:
    """Assign the saved values to each optimizer's variables; ResumeError when they differ in
    number or shape (another optimizer than the one that wrote them)."""
    _check_names(named, record, folder)
    with np.load(os.path.join(folder, VALUES_FILENAME)) as saved:
        for name, optimizer in named.items():
            entry = record[name]
            if entry.get("built_for") is None:
                continue
            variables = variables_of(optimizer)
            if len(variables) != int(entry["count"]) or entry["class"] != type(optimizer).__name__:
                raise errors.ResumeError(
                    f"Optimizer {name!r} is a {type(optimizer).__name__} with "
                    f"{len(variables)} variables; the checkpoint in {folder} holds a "
                    f"{entry['class']} with {entry['count']}. Use the optimizer the run that "
                    "wrote it used."
                )
            for i, var in enumerate(variables):
                value = saved[f"{entry['key']}_{i}"]
                if tuple(var.shape) != value.shape:
                    raise errors.ResumeError(
                        f"Variable {i} of optimizer {name!r} has shape {tuple(var.shape)}; the "
                        f"checkpoint in {folder} holds {value.shape}. Use the model and "
                        "optimizer the run that wrote it used."
                    )
                var.assign(value)


__all__ = [
    "MODEL_OPTIMIZER",
    "OPTIMIZERS_FILENAME",
    "VALUES_FILENAME",
    "assign",
    "build",
    "named_optimizers",
    "read",
    "variables_of",
]
