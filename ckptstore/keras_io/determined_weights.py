"""Load weights (and optimizer state) from Determined checkpoints into a Keras 3 model.

Determined wrote Keras 2 (``tf.keras``) checkpoints that Keras 3 cannot read directly:

- ``DeterminedCallback``: ``model_checkpoint.{index,data-*}``, a TF object-graph checkpoint of
  ``model.save_weights()`` with the optimizer (slots as ``.OPTIMIZER_SLOT/optimizer/m``);
- ``TFKerasTrial``: ``determined-keras-model-weights.{index,data-*}`` (same format) and
  ``determined-keras-optimizer-weights.h5`` (Keras 2 optimizer weights, one group per optimizer);
- older ``TFKerasTrial``: ``determined-keras-model.h5`` (a whole Keras 2 HDF5 model).

The checkpoint's variables are matched to the Keras 3 model's ``model.weights`` in order
(layers in order, each layer's weights in creation order), with shapes checked; optimizer
slots are matched to the model's trainable variables and written into the Keras 3 optimizer's
own slot lists (Adam ``m``/``v`` -> momentums/velocities, SGD ``momentum``, RMSprop ``rms``, ...).
The model must be built by the user's code (and compiled, for optimizer state).

Example::

    import keras
    import ckptstore.keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    result = ckptstore.keras.load_determined_checkpoint(model, "/downloads/det-ckpt")
    print(result.layout, result.weights_loaded, result.optimizer_variables_loaded)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing import determined_import as det_import

logger = logging.getLogger(__name__)

#: Keras 2 slot name -> Keras 3 optimizer attributes that may hold that slot (first found wins).
SLOT_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "m": ("_momentums", "_m"),
    "v": ("_velocities", "_u"),
    "vhat": ("_velocity_hats",),
    "momentum": ("momentums", "_momentums"),
    "rms": ("_velocities",),
    "mg": ("_average_gradients",),
    "accumulator": ("_accumulators",),
    "linear": ("_linears",),
    "accum_grad": ("_accumulated_grads",),
    "accum_var": ("_accumulated_delta_vars",),
}
ITERATION_NAMES = ("iter", "iterations", "_iterations")
_SKIP_CHILDREN = {"optimizer", "save_counter", "keras_api", "_CHECKPOINTABLE_OBJECT_GRAPH"}
_LAYER_RE = re.compile(r"^layer_with_weights-(\d+)$")
_VALUE_ATTR = "VARIABLE_VALUE"


@dataclasses.dataclass
class DeterminedLoadResult:
    """What :func:`load_determined_checkpoint` loaded."""

    layout: str
    weights_loaded: int
    optimizer_variables_loaded: int = 0
    iterations: int | None = None
    steps_completed: int = 0
    epoch: int | None = None
    continue_id: Any = None
    callback_state: dict[str, Any] | None = None
    pickles_skipped: list[str] = dataclasses.field(default_factory=list)


# ---- assigning ----------------------------------------------------------------------------------
def _assign_in_order(
    targets: Sequence[Any], values: Sequence[tuple[str, np.ndarray]], where: str
) -> int:
    if len(targets) != len(values):
        names = ", ".join(name for name, _ in values[:6])
        raise errors.ModelLoadError(
            f"{where} holds {len(values)} weight(s) ({names}{', ...' if len(values) > 6 else ''}) "
            f"but the Keras model has {len(targets)}. Build the same architecture the checkpoint "
            "was trained with (same layers in the same order) before loading."
        )
    for index, (variable, (name, value)) in enumerate(zip(targets, values, strict=True)):
        if tuple(variable.shape) != tuple(value.shape):
            raise errors.ModelLoadError(
                f"Weight #{index} {name!r} in {where} has shape {tuple(value.shape)} but the model's "
                f"variable {variable.path if hasattr(variable, 'path') else variable.name!r} has "
                f"shape {tuple(variable.shape)}. Build the model exactly as it was trained."
            )
    for variable, (_, value) in zip(targets, values, strict=True):
        variable.assign(value.astype(variable.dtype) if hasattr(value, "astype") else value)
    return len(values)


def _optimizer_for(model: Any) -> Any | None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return optimizer


def _slot_list(optimizer: Any, slot: str) -> list[Any] | None:
    for attr in SLOT_ATTRIBUTES.get(slot, ()):
        values = getattr(optimizer, attr, None)
        if isinstance(values, list | tuple) and values:
            return list(values)
    return None


def _assign_slots(
    optimizer: Any,
    model: Any,
    slots: list[tuple[str, Any, np.ndarray, str]],
    where: str,
) -> int:
    """``slots`` = (slot name, model variable, value, source name)."""
    loaded = 0
    trainable_ids = {id(v): i for i, v in enumerate(model.trainable_variables)}
    for slot, variable, value, name in slots:
        targets = _slot_list(optimizer, slot)
        if targets is None:
            raise errors.ModelLoadError(
                f"{where} has optimizer slot {slot!r} ({name}) but the model's optimizer "
                f"{type(optimizer).__name__} has no such state. Compile the model with the "
                "optimizer it was trained with (e.g. Adam for m/v slots)."
            )
        index = trainable_ids.get(id(variable))
        if index is None:
            continue
        target = targets[index]
        if target is None:
            continue
        if tuple(target.shape) != tuple(value.shape):
            raise errors.ModelLoadError(
                f"Optimizer slot {name!r} in {where} has shape {tuple(value.shape)}, the model's "
                f"{target.path} has {tuple(target.shape)}."
            )
        target.assign(value)
        loaded += 1
    return loaded


def _assign_iterations(optimizer: Any, value: Any) -> int:
    optimizer.iterations.assign(int(np.asarray(value)))
    return int(np.asarray(value))


# ---- TF object-graph checkpoints ----------------------------------------------------------------
def _tf_reader(prefix: str) -> tuple[Any, Any]:
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as exc:  # noqa: BLE001 - TF raises several types
        raise errors.ModelLoadError(
            f"Could not read the TensorFlow checkpoint {prefix!r} ({exc}); the .index/.data files "
            "are missing or damaged."
        ) from None
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return reader, graph


def _value_key(node: Any) -> str | None:
    for attribute in node.attributes:
        if attribute.name == _VALUE_ATTR:
            return attribute.checkpoint_key
    return None


def _ordered_variable_nodes(graph: Any, node_id: int, seen: set[int]) -> list[int]:
    node = graph.nodes[node_id]
    if _value_key(node) is not None:
        return [node_id]
    children = list(node.children)
    layered = [c for c in children if _LAYER_RE.match(c.local_name)]
    if layered:
        children = sorted(layered, key=lambda c: int(_LAYER_RE.match(c.local_name).group(1)))
    else:
        children = [c for c in children if c.local_name not in _SKIP_CHILDREN]
    found: list[int] = []
    for child in children:
        if child.node_id in seen:
            continue
        seen.add(child.node_id)
        found.extend(_ordered_variable_nodes(graph, child.node_id, seen))
    return found


def _child(graph: Any, node_id: int, name: str) -> int | None:
    for child in graph.nodes[node_id].children:
        if child.local_name == name:
            return child.node_id
    return None


def load_tf_checkpoint(
    model: Any, prefix: str, *, load_optimizer: bool = True
) -> tuple[int, int, int | None]:
    """Load a Keras 2 TF-format checkpoint at ``prefix`` (no ``.index`` suffix) into ``model``.

    Returns ``(weights loaded, optimizer variables loaded, iterations or None)``.
    """
    reader, graph = _tf_reader(prefix)
    root = 0
    names = {c.local_name for c in graph.nodes[0].children}
    if "model" in names and not any(_LAYER_RE.match(n) for n in names):
        root = _child(graph, 0, "model")  # tf.train.Checkpoint(model=..., optimizer=...)
    nodes = _ordered_variable_nodes(graph, root, {root})
    values = [
        (_value_key(graph.nodes[n]), reader.get_tensor(_value_key(graph.nodes[n]))) for n in nodes
    ]
    weights = list(model.weights)
    if not weights:
        raise errors.ModelLoadError(
            "The Keras model has no weights yet: build it (keras.Input in the model, or "
            "model.build(input_shape)) before loading a Determined checkpoint."
        )
    loaded = _assign_in_order(weights, values, prefix)
    optimizer_node = _child(graph, root, "optimizer")
    if optimizer_node is None and root != 0:
        optimizer_node = _child(graph, 0, "optimizer")
    if not load_optimizer or optimizer_node is None:
        return loaded, 0, None
    optimizer = _optimizer_for(model)
    if optimizer is None:
        logger.warning(
            "%s holds optimizer state but the model is not compiled; only weights were loaded. "
            "Compile the model first to restore the optimizer too.",
            prefix,
        )
        return loaded, 0, None
    variable_of = {node_id: weights[i] for i, node_id in enumerate(nodes)}
    slots = []
    for ref in graph.nodes[optimizer_node].slot_variables:
        if ref.original_variable_node_id not in variable_of:
            continue
        key = _value_key(graph.nodes[ref.slot_variable_node_id])
        slots.append(
            (ref.slot_name, variable_of[ref.original_variable_node_id], reader.get_tensor(key), key)
        )
    count = _assign_slots(optimizer, model, slots, prefix)
    iterations = None
    for name in ITERATION_NAMES:
        node_id = _child(graph, optimizer_node, name)
        if node_id is not None and _value_key(graph.nodes[node_id]):
            iterations = _assign_iterations(
                optimizer, reader.get_tensor(_value_key(graph.nodes[node_id]))
            )
            count += 1
            break
    if not slots and _child(graph, optimizer_node, "_variables") is not None:
        logger.warning(
            "%s stores optimizer state in the Keras 2.11+ layout, which is not mapped; the "
            "optimizer starts fresh (iterations restored: %s).",
            prefix,
            iterations,
        )
    return loaded, count, iterations


# ---- HDF5 -----------------------------------------------------------------------------------------
def _attr_names(group: Any, attr: str) -> list[str]:
    values = group.attrs.get(attr, [])
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]


def _h5_model_values(group: Any) -> list[tuple[str, np.ndarray]]:
    values = []
    for layer_name in _attr_names(group, "layer_names"):
        layer = group[layer_name]
        for weight_name in _attr_names(layer, "weight_names"):
            values.append((f"{layer_name}/{weight_name}", np.asarray(layer[weight_name])))
    return values


def parse_optimizer_weight_name(name: str) -> tuple[str, str | None]:
    """``"Adam/dense/kernel/m:0"`` -> ``("m", "dense/kernel")``; ``"Adam/iter:0"`` ->
    ``("iter", None)``; Keras 2.11+ ``"Adam/m/dense/kernel:0"`` -> ``("m", "dense/kernel")``;
    anything else -> ``("", None)``."""
    parts = name.split(":")[0].split("/")
    if len(parts) >= 2 and parts[-1] in ITERATION_NAMES and len(parts) == 2:
        return "iter", None
    if len(parts) >= 3 and parts[-1] in SLOT_ATTRIBUTES:
        return parts[-1], "/".join(parts[1:-1])
    if len(parts) >= 3 and parts[1] in SLOT_ATTRIBUTES:
        return parts[1], "/".join(parts[2:])
    return "", None


def _load_h5_optimizer(model: Any, group: Any, where: str) -> tuple[int, int | None]:
    optimizer = _optimizer_for(model)
    if optimizer is None:
        logger.warning("%s holds optimizer state but the model is not compiled; skipped.", where)
        return 0, None
    names = _attr_names(group, "weight_names")
    per_slot: dict[str, list[tuple[str, np.ndarray]]] = {}
    iterations = None
    count = 0
    for name in names:
        slot, _ = parse_optimizer_weight_name(name)
        value = np.asarray(group[name])
        if slot == "iter":
            iterations = _assign_iterations(optimizer, value)
            count += 1
        elif slot:
            per_slot.setdefault(slot, []).append((name, value))
        else:
            logger.debug("Ignoring optimizer weight %s in %s", name, where)
    trainable = list(model.trainable_variables)
    slots = []
    for slot, entries in per_slot.items():
        if len(entries) != len(trainable):
            raise errors.ModelLoadError(
                f"{where} has {len(entries)} optimizer {slot!r} slot(s) but the model has "
                f"{len(trainable)} trainable variables; build the architecture it was trained with."
            )
        slots.extend(
            (slot, var, value, name) for var, (name, value) in zip(trainable, entries, strict=True)
        )
    return count + _assign_slots(optimizer, model, slots, where), iterations


def load_h5_model(
    model: Any, path: str, *, load_optimizer: bool = True
) -> tuple[int, int, int | None]:
    """Load a Keras 2 ``.h5`` (whole model or weights only) into ``model``."""
    import h5py

    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f else f
        loaded = _assign_in_order(list(model.weights), _h5_model_values(group), path)
        if load_optimizer and "optimizer_weights" in f:
            count, iterations = _load_h5_optimizer(model, f["optimizer_weights"], path)
            return loaded, count, iterations
    return loaded, 0, None


def load_h5_optimizer_file(model: Any, path: str) -> tuple[int, int | None]:
    """Load ``determined-keras-optimizer-weights.h5`` (group ``optimizer-0``) into the model's
    optimizer."""
    import h5py

    with h5py.File(path, "r") as f:
        if "optimizer-0" not in f:
            return 0, None
        if len([k for k in f if k.startswith("optimizer-")]) > 1:
            logger.warning("%s holds several optimizers; only optimizer-0 is loaded.", path)
        group = f["optimizer-0"]
        if "optimizer_weights" not in group:
            return 0, None
        return _load_h5_optimizer(model, group["optimizer_weights"], path)


# ---- entry point ----------------------------------------------------------------------------------
def load_determined_checkpoint(
    model: Any,
    path: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    load_optimizer: bool = True,
) -> DeterminedLoadResult:
    """Load a Determined checkpoint folder's weights (and optimizer state) into ``model``.

    ``path`` is a local folder in one of Determined's Keras layouts (download remote ones first,
    e.g. ``ckptstore checkpoint download UUID``). ``callback_state`` and other pickles are read
    only with ``trust_pickle=True``; their epoch/continue_id then appear in the result.
    Raises :class:`~ckptstore.errors.ModelLoadError` when the model does not match.
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise errors.ModelLoadError(
            f"{folder!r} is not a folder; pass the local folder of a Determined checkpoint."
        )
    info = det_import.read_determined_info(folder, trust_pickle=trust_pickle)
    optimizer_count, iterations = 0, None
    if info.layout == det_import.CALLBACK:
        loaded, optimizer_count, iterations = load_tf_checkpoint(
            model, os.path.join(folder, "model_checkpoint"), load_optimizer=load_optimizer
        )
    elif info.layout == det_import.TFKERAS_TRIAL:
        loaded, optimizer_count, iterations = load_tf_checkpoint(
            model,
            os.path.join(folder, "determined-keras-model-weights"),
            load_optimizer=load_optimizer,
        )
        h5_path = os.path.join(folder, "determined-keras-optimizer-weights.h5")
        if load_optimizer and optimizer_count == 0 and os.path.isfile(h5_path):
            optimizer_count, iterations = load_h5_optimizer_file(model, h5_path)
    else:
        loaded, optimizer_count, iterations = load_h5_model(
            model, os.path.join(folder, "determined-keras-model.h5"), load_optimizer=load_optimizer
        )
    logger.info(
        "Loaded %d weights and %d optimizer variables from Determined %s checkpoint %s",
        loaded,
        optimizer_count,
        info.layout,
        folder,
    )
    return DeterminedLoadResult(
        layout=info.layout,
        weights_loaded=loaded,
        optimizer_variables_loaded=optimizer_count,
        iterations=iterations,
        steps_completed=info.steps_completed,
        epoch=info.epoch,
        continue_id=info.continue_id,
        callback_state=info.callback_state,
        pickles_skipped=list(info.pickles_skipped),
    )
