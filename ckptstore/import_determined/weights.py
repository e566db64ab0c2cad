"""Load weights (and optimizer state) from Determined checkpoints into a Keras 3 model.

Determined wrote Keras 2 (``tf.keras``) checkpoints that Keras 3 cannot read directly:

- ``DeterminedCallback``: ``model_checkpoint.{index,data-*}``, a TF object-graph checkpoint of
  ``model.save_weights()`` with the optimizer;
- ``TFKerasTrial``: ``determined-keras-model-weights.{index,data-*}`` (same format) and
  ``determined-keras-optimizer-weights.h5`` (Keras 2 optimizer weights, one group per optimizer);
- older ``TFKerasTrial``: ``determined-keras-model.h5`` (a whole Keras 2 HDF5 model), and in
  Determined 0.12 the same file named ``determined-keras-model``.

The checkpoint's variables are matched to the Keras 3 model's ``model.weights`` in order
(layers in order, each layer's weights in creation order), with shapes checked. Optimizer state
comes in two Keras 2 layouts, both mapped onto the Keras 3 optimizer's own variables:

- legacy optimizers (TF < 2.11, ``tf.keras.optimizers.legacy.*``): slots attached to each model
  variable (``.OPTIMIZER_SLOT/optimizer/m``; in HDF5 ``Adam/dense/kernel/m:0``), plus
  ``optimizer/iter`` and ``optimizer/learning_rate``;
- Keras 2.11+ optimizers (TF 2.11 to 2.15, ``tf_keras``): one flat list
  ``optimizer/_variables/N`` = ``iterations``, then (with ``use_ema``) one average per trainable
  variable, then each state block of the optimizer interleaved per trainable variable (Adam:
  ``m0, v0, m1, v1, ...``, then ``vhat`` per variable with ``amsgrad``), plus
  ``optimizer/_learning_rate`` (and Nadam's ``optimizer/_u_product``); in HDF5 the same list
  as ``iteration:0``, ``Adam/m/dense/kernel:0``... See :data:`NEW_LAYOUT_BLOCKS` for the
  optimizers mapped (Adam, AdamW, Nadam, Adamax, SGD, Lion, RMSprop, Adagrad, Adadelta, Ftrl;
  EMA averages too). Not mapped, with a ModelLoadError that suggests ``load_optimizer=False``:
  Adafactor, custom optimizers, sharded variables. Only ``optimizer-0`` of a multi-optimizer
  HDF5 file is loaded.

Nadam's ``_u_product`` is not in HDF5 files; it is rebuilt from ``iterations``
(:func:`nadam_u_product`). Legacy Nadam and RMSprop load, but their update rules differ from
Keras 3's (see :data:`LEGACY_ALGORITHM_NOTES`), which is warned about.

The stored learning rate replaces the compiled one (as ``tf.keras`` did on restore) when the Keras 3
optimizer holds its learning rate in a variable. Everything is checked (counts, shapes) before
anything is assigned, so a mismatch raises :class:`~ckptstore.errors.ModelLoadError` and leaves the
model untouched. The model must be built by the user's code (and compiled with the optimizer it
was trained with, and the same settings, for optimizer state).

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
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing import format as ckpt_format
from ckptstore.checkpointing import jsonfiles
from ckptstore.import_determined import layouts as det_import
from ckptstore.import_determined._plan import (
    _LAYER_RE,
    _SKIP_CHILDREN,
    _VALUE_ATTR,
    HDF5_CONFIG_HYPERPARAMETERS,
    ITERATION_NAMES,
    LEARNING_RATE_NAMES,
    LEGACY_HYPERPARAMETERS,
    NEW_LAYOUT_SCALARS,
    SLOT_ATTRIBUTES,
    _check_optimizer_name,
    _not_compiled,
    _optimizer_for,
    _Plan,
    _plan_in_order,
    _plan_iterations,
    _plan_learning_rate,
    _plan_legacy_slots,
    _plan_new_layout,
    _warn_hyperparameter,
    nadam_u_product,
)
from ckptstore.keras_model import KerasModel

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DeterminedLoadResult:
    """What :func:`load_determined_checkpoint` loaded.

    ``optimizer_layout`` is ``"legacy"`` (per-variable slots), ``"keras_2_11"`` (the flat
    ``_variables`` list of Keras 2.11+ optimizers) or ``None`` when no optimizer state was loaded.
    """

    layout: str
    weights_loaded: int
    optimizer_variables_loaded: int = 0
    iterations: int | None = None
    steps_completed: int = 0
    epoch: int | None = None
    continue_id: Any = None
    callback_state: dict[str, Any] | None = None
    pickles_skipped: list[str] = dataclasses.field(default_factory=list)
    learning_rate: float | None = None
    optimizer_layout: str | None = None


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


class _TFCheckpoint:
    """A TF object-graph checkpoint: values by object path."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.reader, self.graph = _tf_reader(prefix)

    def value(self, node_id: int) -> tuple[str, np.ndarray] | None:
        key = _value_key(self.graph.nodes[node_id])
        return None if key is None else (key, self.reader.get_tensor(key))

    def child_value(self, node_id: int, names: Sequence[str]) -> tuple[str, np.ndarray] | None:
        for name in names:
            child = _child(self.graph, node_id, name)
            if child is not None and self.value(child) is not None:
                return self.value(child)
        return None

    def list_values(self, node_id: int) -> list[tuple[str, np.ndarray]]:
        """The values of a tracked list's elements ``0, 1, ...`` in order."""
        children = [c for c in self.graph.nodes[node_id].children if c.local_name.isdigit()]
        children.sort(key=lambda c: int(c.local_name))
        if [int(c.local_name) for c in children] != list(range(len(children))):
            raise errors.ModelLoadError(
                f"{self.prefix}: the optimizer's _variables list has gaps "
                f"({[c.local_name for c in children]}); the checkpoint is damaged."
            )
        values = []
        for child in children:
            value = self.value(child.node_id)
            if value is None:
                raise errors.ModelLoadError(
                    f"{self.prefix}: optimizer _variables/{child.local_name} holds no value; "
                    "the checkpoint is damaged (or uses sharded variables, which are not mapped)."
                )
            values.append(value)
        return values


def _plan_tf_optimizer(
    ckpt: _TFCheckpoint, optimizer_node: int, model: KerasModel, variable_of: dict[int, Any]
) -> _Plan:
    where = ckpt.prefix
    optimizer = _optimizer_for(model)
    if optimizer is None:
        _not_compiled(where)
        return _Plan()
    plan = _Plan()
    variables_node = _child(ckpt.graph, optimizer_node, "_variables")
    if variables_node is not None:  # Keras 2.11+ optimizer
        values = ckpt.list_values(variables_node)
        if not values:
            return plan  # never built: no state yet
        name, iterations = values[0]
        plan.extend(_plan_iterations(optimizer, iterations, name, where))
        scalars = {}
        for scalar in NEW_LAYOUT_SCALARS:
            stored = ckpt.child_value(optimizer_node, (scalar,))
            if stored is not None:
                scalars[scalar] = stored[1]
        plan.extend(
            _plan_new_layout(
                optimizer,
                model,
                values[1:],
                where,
                iterations=plan.iterations or 0,
                scalars=scalars,
            )
        )
    else:  # legacy optimizer: slots hang off the model variables
        slots = []
        for ref in ckpt.graph.nodes[optimizer_node].slot_variables:
            if ref.original_variable_node_id not in variable_of:
                continue
            key, value = ckpt.value(ref.slot_variable_node_id)
            slots.append((ref.slot_name, variable_of[ref.original_variable_node_id], value, key))
        plan.extend(_plan_legacy_slots(optimizer, model, slots, where))
        stored = ckpt.child_value(optimizer_node, ITERATION_NAMES)
        if stored is not None:
            plan.extend(_plan_iterations(optimizer, stored[1], stored[0], where))
            plan.optimizer_layout = "legacy"
        for name in LEGACY_HYPERPARAMETERS:
            stored = ckpt.child_value(optimizer_node, (name,))
            if stored is not None:
                _warn_hyperparameter(optimizer, name, float(stored[1]), where)
    stored = ckpt.child_value(optimizer_node, LEARNING_RATE_NAMES)
    if stored is not None and plan.assignments:
        plan.extend(_plan_learning_rate(optimizer, stored[1], stored[0]))
    return plan


def _plan_tf_checkpoint(
    model: KerasModel, prefix: str, *, load_optimizer: bool
) -> tuple[_Plan, int]:
    """Plan loading a Keras 2 TF-format checkpoint at ``prefix`` (no ``.index`` suffix).

    Returns the plan and the number of model weights in it (the rest is optimizer state).
    """
    ckpt = _TFCheckpoint(prefix)
    graph = ckpt.graph
    root = 0
    names = {c.local_name for c in graph.nodes[0].children}
    if "model" in names and not any(_LAYER_RE.match(n) for n in names):
        root = _child(graph, 0, "model")  # tf.train.Checkpoint(model=..., optimizer=...)
    nodes = _ordered_variable_nodes(graph, root, {root})
    weights = list(model.weights)
    if not weights:
        raise errors.ModelLoadError(
            "The Keras model has no weights yet: build it (keras.Input in the model, or "
            "model.build(input_shape)) before loading a Determined checkpoint."
        )
    plan = _plan_in_order(weights, [ckpt.value(n) for n in nodes], prefix)
    weight_count = len(plan.assignments)
    optimizer_node = _child(graph, root, "optimizer")
    if optimizer_node is None and root != 0:
        optimizer_node = _child(graph, 0, "optimizer")
    if load_optimizer and optimizer_node is not None:
        variable_of = {node_id: weights[i] for i, node_id in enumerate(nodes)}
        plan.extend(_plan_tf_optimizer(ckpt, optimizer_node, model, variable_of))
    return plan, weight_count


def load_tf_checkpoint(
    model: KerasModel, prefix: str, *, load_optimizer: bool = True
) -> tuple[int, int, int | None]:
    """Load a Keras 2 TF-format checkpoint at ``prefix`` (no ``.index`` suffix) into ``model``.

    Returns ``(weights loaded, optimizer variables loaded, iterations or None)``.
    """
    plan, weight_count = _plan_tf_checkpoint(model, prefix, load_optimizer=load_optimizer)
    total = plan.commit()
    return weight_count, total - weight_count, plan.iterations


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


def is_new_layout_h5(names: Sequence[str]) -> bool:
    """Whether HDF5 optimizer weight names come from a Keras 2.11+ optimizer (``iteration:0``
    first, then ``Adam/m/dense/kernel:0``...) rather than a legacy one (``Adam/iter:0``)."""
    return bool(names) and names[0].split(":")[0] == "iteration"


def _plan_h5_optimizer(model: KerasModel, group: Any, where: str) -> _Plan:
    optimizer = _optimizer_for(model)
    if optimizer is None:
        _not_compiled(where)
        return _Plan()
    names = _attr_names(group, "weight_names")
    values = [(name, np.asarray(group[name])) for name in names]
    prefixes = [name.split("/")[0] for name in names if "/" in name]
    if prefixes:
        _check_optimizer_name(optimizer, prefixes[0], where)
    if is_new_layout_h5(names):
        plan = _plan_iterations(optimizer, values[0][1], names[0], where)
        plan.extend(
            _plan_new_layout(optimizer, model, values[1:], where, iterations=plan.iterations or 0)
        )
        return plan
    plan = _Plan()
    per_slot: dict[str, list[tuple[str, np.ndarray]]] = {}
    for name, value in values:
        slot, _ = parse_optimizer_weight_name(name)
        if slot == "iter":
            plan.extend(_plan_iterations(optimizer, value, name, where))
            plan.optimizer_layout = "legacy"
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
    plan.extend(_plan_legacy_slots(optimizer, model, slots, where))
    return plan


def _stored_optimizer_config(f: Any) -> tuple[str, dict[str, Any]]:
    """(class name, config) of the optimizer in a Keras 2 HDF5 model's ``training_config``."""
    raw = f.attrs.get("training_config")
    if raw is None:
        return "", {}
    try:
        # Bounded size and depth: a hostile file's deep nesting is ignored, not a RecursionError.
        config = jsonfiles.load_json(raw, "training_config", ckpt_format.MAX_MANIFEST_BYTES)
        optimizer = config.get("optimizer_config") or {}
        class_name = str(optimizer.get("class_name", "")).split(">")[-1]
        return class_name, dict(optimizer.get("config") or {})
    except (errors.InvalidCheckpoint, ValueError, AttributeError, TypeError):
        logger.debug("Unreadable training_config in an HDF5 model; ignored.")
        return "", {}


def _plan_h5_model(model: KerasModel, path: str, *, load_optimizer: bool) -> tuple[_Plan, int]:
    import h5py

    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f else f
        plan = _plan_in_order(list(model.weights), _h5_model_values(group), path)
        weight_count = len(plan.assignments)
        if load_optimizer and "optimizer_weights" in f:
            optimizer_plan = _plan_h5_optimizer(model, f["optimizer_weights"], path)
            if optimizer_plan.assignments:
                class_name, config = _stored_optimizer_config(f)
                _check_optimizer_name(model.optimizer, class_name, path)
                for name in HDF5_CONFIG_HYPERPARAMETERS:
                    if isinstance(config.get(name), float | int | bool):
                        _warn_hyperparameter(model.optimizer, name, float(config[name]), path)
                if isinstance(config.get("learning_rate"), float | int):
                    optimizer_plan.extend(
                        _plan_learning_rate(
                            model.optimizer, config["learning_rate"], "training_config"
                        )
                    )
            plan.extend(optimizer_plan)
    return plan, weight_count


def load_h5_model(
    model: KerasModel, path: str, *, load_optimizer: bool = True
) -> tuple[int, int, int | None]:
    """Load a Keras 2 ``.h5`` (whole model or weights only) into ``model``."""
    plan, weight_count = _plan_h5_model(model, path, load_optimizer=load_optimizer)
    total = plan.commit()
    return weight_count, total - weight_count, plan.iterations


def _plan_h5_optimizer_file(model: KerasModel, path: str) -> _Plan:
    import h5py

    with h5py.File(path, "r") as f:
        if "optimizer-0" not in f:
            return _Plan()
        if len([k for k in f if k.startswith("optimizer-")]) > 1:
            logger.warning("%s holds several optimizers; only optimizer-0 is loaded.", path)
        group = f["optimizer-0"]
        if "optimizer_weights" not in group:
            return _Plan()
        return _plan_h5_optimizer(model, group["optimizer_weights"], path)


def load_h5_optimizer_file(model: KerasModel, path: str) -> tuple[int, int | None]:
    """Load ``determined-keras-optimizer-weights.h5`` (group ``optimizer-0``, as Determined wrote
    it with Keras' ``save_optimizer_weights_to_hdf5_group``) into the model's optimizer.

    Returns ``(optimizer variables loaded, iterations or None)``."""
    plan = _plan_h5_optimizer_file(model, path)
    return plan.commit(), plan.iterations


# ---- entry point ----------------------------------------------------------------------------------
def load_determined_checkpoint(
    model: KerasModel,
    path: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    load_optimizer: bool = True,
) -> DeterminedLoadResult:
    """Load a Determined checkpoint folder's weights (and optimizer state) into ``model``.

    ``path`` is a local folder in one of Determined's Keras layouts (download remote ones first,
    e.g. ``ckptstore checkpoint download UUID``). ``callback_state`` and other pickles are read
    only with ``trust_pickle=True``; their epoch/continue_id then appear in the result.
    Raises :class:`~ckptstore.errors.ModelLoadError` when the model (or its optimizer) does not
    match; nothing is assigned then.
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise errors.ModelLoadError(
            f"{folder!r} is not a folder; pass the local folder of a Determined checkpoint."
        )
    info = det_import.read_determined_info(folder, trust_pickle=trust_pickle)
    if info.layout == det_import.CALLBACK:
        plan, weight_count = _plan_tf_checkpoint(
            model, os.path.join(folder, "model_checkpoint"), load_optimizer=load_optimizer
        )
    elif info.layout == det_import.TFKERAS_TRIAL:
        plan, weight_count = _plan_tf_checkpoint(
            model,
            os.path.join(folder, "determined-keras-model-weights"),
            load_optimizer=load_optimizer,
        )
        h5_path = os.path.join(folder, "determined-keras-optimizer-weights.h5")
        if load_optimizer and len(plan.assignments) == weight_count and os.path.isfile(h5_path):
            plan.extend(_plan_h5_optimizer_file(model, h5_path))
    else:  # one whole-model HDF5 file, named by the layout (0.12 gave it no extension)
        plan, weight_count = _plan_h5_model(
            model,
            os.path.join(folder, det_import.LAYOUT_MARKERS[info.layout]),
            load_optimizer=load_optimizer,
        )
    total = plan.commit()
    logger.info(
        "Loaded %d weights and %d optimizer variables (%s layout) from Determined %s checkpoint %s",
        weight_count,
        total - weight_count,
        plan.optimizer_layout,
        info.layout,
        folder,
    )
    return DeterminedLoadResult(
        layout=info.layout,
        weights_loaded=weight_count,
        optimizer_variables_loaded=total - weight_count,
        iterations=plan.iterations,
        steps_completed=info.steps_completed,
        epoch=info.epoch,
        continue_id=info.continue_id,
        callback_state=info.callback_state,
        pickles_skipped=list(info.pickles_skipped),
        learning_rate=plan.learning_rate,
        optimizer_layout=plan.optimizer_layout,
    )


__all__ = [
    "DeterminedLoadResult",
    "is_new_layout_h5",
    "load_determined_checkpoint",
    "load_h5_model",
    "load_h5_optimizer_file",
    "load_tf_checkpoint",
    "nadam_u_product",
    "parse_optimizer_weight_name",
]
