"""Every optimizer of a model in its checkpoints, each by name (TFKerasTrial and
``DeterminedCallback``).

A trial may train with optimizers that are not ``model.optimizer``: a GAN wraps its generator's
and discriminator's with ``context.wrap_optimizer`` and passes them to its own ``compile()``,
whose ``super().compile()`` leaves Keras's default optimizer unused. ``optimizers.json`` names
each optimizer (``model.optimizer`` under :data:`MODEL_OPTIMIZER`, a wrapped one by the model
attribute that holds it, else ``optimizer-<position>``), whether it was built and for which model
variables (their positions in ``model.weights``); ``optimizers.npz`` holds its variables' values
in order (``iterations``, learning rate, slots). Resuming builds each optimizer for the same
variables, then assigns the values: an optimizer the run never used stays unbuilt, so its absent
state is not an error. Works for Keras 3 optimizers, Keras 2.11+ ones and Keras 2 legacy ones.

``DeterminedCallback`` (Keras 3) writes only ``optimizers.json``, for the optimizers the model
holds in its own attributes (:func:`attribute_optimizers`): their values are in ``model.keras``
already, which Keras loads only into an optimizer built for as many variables, so a resume
builds them first (:func:`build_attribute_optimizers`).

Example::

    named = named_optimizers(model, context.optimizers)
    write(folder, model, named)            # into the checkpoint
    record = read(folder)                  # on resume
    build(model, named, record); assign(named, record, folder)
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing import jsonfiles
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


def attribute_optimizers(model: KerasModel) -> dict[str, Any]:
    """The optimizers ``model`` holds in its own public attributes (a GAN's ``d_optimizer``,
    set in its ``compile()``), by attribute name; ``model.optimizer`` is not among them."""
    main = getattr(model, "optimizer", None)
    return {
        key: value
        for key, value in sorted(vars(model).items())
        if not key.startswith("_")
        and key != "optimizer"
        and value is not main
        and hasattr(value, "apply_gradients")
    }


def _built_for(optimizer: Any, weights: list[Any]) -> list[int] | None:
    """Positions in ``weights`` of the variables ``optimizer`` was built for (None: unbuilt)."""
    trainable = getattr(optimizer, "_trainable_variables", None)  # Keras 3
    if isinstance(trainable, (list, tuple)) and getattr(optimizer, "built", False):
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


def describe(model: KerasModel, named: dict[str, Any]) -> dict[str, Any]:
    """The ``optimizers.json`` record of ``named``: each one's class, the positions in
    ``model.weights`` of the variables it was built for (None: unbuilt) and its variable count."""
    weights = list(model.weights)
    record: dict[str, Any] = {}
    for j, (name, optimizer) in enumerate(named.items()):
        built = _built_for(optimizer, weights)
        record[name] = {
            "class": type(optimizer).__name__,
            "built_for": built,
            "count": len(variables_of(optimizer)) if built is not None else 0,
            "key": f"o{j}",
        }
    return record


def write(folder: str, model: KerasModel, named: dict[str, Any]) -> None:
    """Write ``optimizers.json`` and ``optimizers.npz`` into checkpoint ``folder``."""
    record = describe(model, named)
    arrays: dict[str, np.ndarray] = {}
    for name, optimizer in named.items():
        if record[name]["built_for"] is None:
            continue
        for i, var in enumerate(variables_of(optimizer)):
            arrays[f"{record[name]['key']}_{i}"] = np.asarray(var.numpy())
    with open(os.path.join(folder, OPTIMIZERS_FILENAME), "w", encoding="utf-8") as f:
        json.dump(record, f)
    np.savez(os.path.join(folder, VALUES_FILENAME), **arrays)


def read(folder: str) -> dict[str, Any] | None:
    """The ``optimizers.json`` record of a checkpoint (None: written before it existed)."""
    path = os.path.join(folder, OPTIMIZERS_FILENAME)
    if not os.path.isfile(path):
        return None
    record = jsonfiles.read_json_file(path)  # bounded size and depth: typed errors
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


def build_attribute_optimizers(model: KerasModel, folder: str) -> None:
    """Build each optimizer of :func:`attribute_optimizers` for the variables it was built
    for when checkpoint ``folder`` was written (its ``optimizers.json``), so that loading the
    checkpoint's ``model.keras`` fills its slots: Keras 3 loads an optimizer's state only into
    one with as many variables, and skips it with a mere warning otherwise. ResumeError when
    the checkpoint has no record of one of them (another model)."""
    named = attribute_optimizers(model)
    record = read(folder)
    if not named or record is None:
        return
    absent = sorted(set(named) - set(record))
    if absent:
        raise errors.ResumeError(
            f"The model holds optimizers {absent} that the checkpoint in {folder} has no state "
            f"for (it has {sorted(record)}). Build and compile the model as the run that "
            "wrote it did."
        )
    strategy = getattr(model, "distribute_strategy", None)  # slots live where the weights do
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        build(model, named, {k: record[k] for k in named}, folder)


def raise_if_unrestored(model: KerasModel, where: str) -> None:
    """ResumeError when an optimizer of :func:`attribute_optimizers` has taken steps (its
    ``iterations`` was restored) but holds no slots: its state was not in ``where`` (a
    checkpoint written before these optimizers were saved whole), so the resume would
    silently continue from zeroed slots."""
    for name, optimizer in attribute_optimizers(model).items():
        iterations = getattr(optimizer, "iterations", None)
        steps = 0 if iterations is None else int(np.asarray(iterations))
        if getattr(optimizer, "built", True) or steps == 0:
            continue
        raise errors.ResumeError(
            f"The state of optimizer {name!r} ({type(optimizer).__name__}, {steps} steps) "
            f"is not in {where}: only its step count was saved, so training cannot "
            "continue exactly. Resume from a newer checkpoint, or start the optimizer afresh "
            "with another continue_id (a warm start)."
        )


__all__ = [
    "MODEL_OPTIMIZER",
    "OPTIMIZERS_FILENAME",
    "VALUES_FILENAME",
    "assign",
    "attribute_optimizers",
    "build",
    "build_attribute_optimizers",
    "describe",
    "named_optimizers",
    "raise_if_unrestored",
    "read",
    "variables_of",
]
