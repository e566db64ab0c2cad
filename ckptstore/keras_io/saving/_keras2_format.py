"""The Keras 2 (``tf_keras``) checkpoint: what Determined wrote, saved off the training thread.

A Keras 2 checkpoint written by ``DeterminedCallback`` holds

- ``model_checkpoint.index`` / ``model_checkpoint.data-00000-of-00001`` (+ the ``checkpoint``
  state file): the TensorFlow object-graph checkpoint ``model.save_weights(path /
  "model_checkpoint")`` writes — layer weights *and* the optimizer's state (legacy optimizers'
  slots and ``iter``, or a Keras 2.11+ optimizer's variables), exactly what Determined's docs load
  with ``model.load_weights(path / "model_checkpoint")``;
- ``model_config.json``: ``model.to_json()``, so :func:`load_model` can rebuild the model from any
  checkpoint, not only the final one;
- ``saved_model/`` (final checkpoint by default): ``model.save(..., save_format="tf")``, the
  SavedModel ``tf.keras.models.load_model`` reads back for inference, written from the
  checkpoint's own files by a Keras 2 export worker process (:mod:`ckptstore.keras_io.exporting`)
  before the commit — on the training thread only for models no other process can rebuild
  (:func:`worker_export_blocker`);
- ``callback_state.json``, ``metadata.json`` and ``MANIFEST.json`` as for Keras 3.

Saving keeps the Keras 3 path's shape: :func:`take_snapshot` runs TensorFlow's own checkpoint
serialisation (the object graph and one tensor per variable) in the training thread, forcing
every variable read now. A read of a resource variable shares its buffer and the next update of
the variable copies it first (TensorFlow's copy-on-write), so this is a cheap point-in-time
copy; :meth:`Keras2Snapshot.write_into` then writes the files with TensorFlow's saver from the
writer thread, and the folder is handed to storage without another copy.

Example::

    layout = Keras2Layout.of(model)
    snap = take_snapshot(layout)           # training thread, fast
    snap.write_into("/tmp/ckpt")           # any thread: model_checkpoint.* + model_config.json
    load_weights(model, "/tmp/ckpt", with_optimizer=True)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras2_lookups as keras2_lookups

logger = logging.getLogger(__name__)

#: TF checkpoint prefix inside a checkpoint folder (Determined's name).
WEIGHTS_PREFIX = "model_checkpoint"
#: ``model.to_json()`` of the saved model.
MODEL_CONFIG_FILENAME = "model_config.json"
#: The model's ``compile()`` arguments (Keras 2's ``training_config``: optimizer, loss, metrics),
#: so a loaded model comes back compiled with its optimizer state, as ``.keras`` files do.
TRAINING_CONFIG_FILENAME = "training_config.json"


def has_weights(path: str) -> bool:
    """Whether ``path`` holds a ``model_checkpoint`` TF checkpoint."""
    return os.path.isfile(os.path.join(path, WEIGHTS_PREFIX + ".index"))


@dataclasses.dataclass
class _Var:
    variable: Any


@dataclasses.dataclass
class Keras2Layout:
    """What one model's checkpoints need that does not change between saves.

    ``entries`` lists every variable the TF checkpoint holds (the callback skips them when it
    records variables a checkpoint would otherwise miss).
    """

    model: KerasModel
    entries: list[_Var]
    config_json: str | None
    #: Why the export worker cannot rebuild this model (None: it can); see
    #: :func:`worker_export_blocker`.
    export_blocker: str | None = None
    #: The model's compile arguments as JSON (None: not compiled, or not serializable).
    training_json: str | None = None

    @classmethod
    def of(cls, model: KerasModel) -> Keras2Layout:
        try:
            config_json: str | None = model.to_json()
        except (NotImplementedError, TypeError, ValueError) as exc:
            # Subclassed models have no config: checkpoints still resume, and load by
            # building the model in code + load_weights(); log why the file is missing.
            logger.info("Model has no JSON config (%s); %s not written", exc, MODEL_CONFIG_FILENAME)
            config_json = None
        if config_json is not None:
            config_json = keras2_lookups.with_adapted_vocabularies(model, config_json)
        return cls(
            model=model,
            entries=[_Var(v) for v in model.variables],
            config_json=config_json,
            export_blocker=worker_export_blocker(model, config_json),
            training_json=_training_json(model) if config_json is not None else None,
        )

    def close(self) -> None:
        """Nothing to release (the Keras 3 layout keeps an assets folder)."""


@dataclasses.dataclass
class Keras2Snapshot:
    """Tensors of one point in training, ready for TensorFlow's saver."""

    layout: Keras2Layout
    serialized_tensors: Any
    registered_savers: Any

    @property
    def nbytes(self) -> int:
        total = 0
        for tensors in (self.serialized_tensors or {}).values():
            for value in _leaves(tensors):
                size = getattr(getattr(value, "dtype", None), "size", 0)
                total += int(size) * int(getattr(value, "shape", []).num_elements() or 0)
        return total

    def write_into(self, directory: str) -> dict[str, str]:
        """Write ``model_checkpoint.*``, ``checkpoint`` and ``model_config.json`` into
        ``directory``; returns checksums already known (none: the manifest computes them)."""
        import tensorflow as tf
        from tensorflow.python.checkpoint import functional_saver

        prefix = os.path.join(directory, WEIGHTS_PREFIX)
        if self.serialized_tensors is None:  # graph mode: see take_snapshot
            self.layout.model.save_weights(prefix, save_format="tf")
        else:
            saver = functional_saver.MultiDeviceSaver(
                self.serialized_tensors, self.registered_savers
            )
            with tf.device("/cpu:0"):
                saver.save(tf.constant(prefix))
        tf.__internal__.train.update_checkpoint_state(
            save_dir=directory,
            model_checkpoint_path=WEIGHTS_PREFIX,
            all_model_checkpoint_paths=[WEIGHTS_PREFIX],
            save_relative_paths=True,
        )
        for name, text in (
            (MODEL_CONFIG_FILENAME, self.layout.config_json),
            (TRAINING_CONFIG_FILENAME, self.layout.training_json),
        ):
            if text is not None:
                with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                    f.write(text)
        self.serialized_tensors = None  # the values are on disk: let the tensors go
        return {}


def _training_json(model: KerasModel) -> str | None:
    """``model``'s compile arguments as Keras 2 writes them into HDF5/SavedModel files, or None
    when it is not compiled or they do not serialize (a loaded model is then uncompiled)."""
    from tf_keras.src.saving.legacy import saving_utils
    from tf_keras.src.saving.legacy.saved_model import json_utils

    if getattr(model, "optimizer", None) is None:
        return None
    try:
        meta = saving_utils.model_metadata(model, include_optimizer=True, require_config=False)
        training = meta.get("training_config")
        if training and getattr(model, "_jit_compile", None) is True:
            # not in Keras 2's legacy training_config: a model loaded without it predicts
            # through the graph, not XLA, and differs from the trained model in the last bit
            training["jit_compile"] = True
        return json.dumps(training, default=json_utils.get_json_type) if training else None
    except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
        # Best effort, as for model_config.json: a model whose compile arguments do not
        # serialize still checkpoints and resumes; it only loads uncompiled.
        logger.info(
            "Compile arguments not serializable (%s); %s not written", exc, TRAINING_CONFIG_FILENAME
        )
        return None


def _leaves(tensors: Any) -> list[Any]:
    if isinstance(tensors, Mapping):
        return [leaf for value in tensors.values() for leaf in _leaves(value)]
    return [tensors]


def _force(value: Any) -> Any:
    """Evaluate TensorFlow's lazy read (a ``SaveSpec`` callable) now, in this thread."""
    from tensorflow.python.training.saving import saveable_object

    if isinstance(value, Mapping):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, saveable_object.SaveSpec):
        return value.tensor
    return value


def take_snapshot(layout: Keras2Layout) -> Keras2Snapshot:
    """Serialise ``layout.model`` (weights + optimizer) into tensors now; see the module doc.

    In graph mode (``tf.compat.v1.disable_eager_execution()``) the saver's ops would only be
    built, never run, and nothing would reach the disk: the snapshot then holds no tensors and
    :meth:`Keras2Snapshot.write_into` saves through Keras's own session-aware
    ``save_weights`` at once (the trial controller writes in its own thread, so "now" holds).
    """
    import tensorflow as tf

    from ckptstore.keras_io import backend

    if backend.graph_mode():
        return Keras2Snapshot(layout=layout, serialized_tensors=None, registered_savers=None)
    from tensorflow.python.checkpoint import graph_view, save_util
    from tensorflow.python.trackable import base

    serialized, _feed, registered, proto = save_util.serialize_graph_view(
        graph_view.ObjectGraphView(layout.model)
    )
    from tensorflow.python.util import object_identity

    forced = object_identity.ObjectIdentityDictionary()  # variables are not hashable
    for trackable, tensors in serialized.items():
        forced[trackable] = _force(tensors)
    with tf.device("/cpu:0"):
        graph_tensor = tf.constant(proto.SerializeToString(), dtype=tf.string)
    forced.setdefault(None, {})[base.OBJECT_GRAPH_PROTO_KEY] = graph_tensor
    return Keras2Snapshot(layout=layout, serialized_tensors=forced, registered_savers=registered)


def _weights_only_root(model: KerasModel) -> Any:
    """A checkpoint root with the model's children except its optimizer (warm start)."""
    import tensorflow as tf

    children = {
        name: child
        for name, child in model._trackable_children(save_type="checkpoint").items()
        if name != "optimizer" and not name.endswith("_function")
    }
    return tf.train.Checkpoint(**children)


def _create_legacy_slots(model: KerasModel) -> None:
    """Create a legacy optimizer's slots now (zeros, as its first step would).

    Otherwise TensorFlow restores them only when that first step creates them, reading the
    checkpoint files then — after a downloaded checkpoint's temporary folder is gone.
    """
    optimizer = getattr(model, "optimizer", None)
    create = getattr(optimizer, "_create_all_weights", None)
    if not callable(create) or not model.trainable_variables:
        return
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None:
        with strategy.scope():
            create(model.trainable_variables)
    else:
        create(model.trainable_variables)


def build_optimizer(model: KerasModel) -> None:
    """Create ``model.optimizer``'s variables now, so a load restores them (Keras 2 legacy
    optimizers have no build(): TensorFlow restores their slots when the first step makes them;
    Keras 2.11+ optimizers keep the flag in ``_built``)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "build"):
        return
    if getattr(optimizer, "built", None) or getattr(optimizer, "_built", False):
        return
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None:
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    else:
        optimizer.build(model.trainable_variables)


def load_weights(model: KerasModel, path: str, *, with_optimizer: bool) -> None:
    """Restore ``path/model_checkpoint`` into ``model`` (and its optimizer if ``with_optimizer``).

    A legacy optimizer's slots are created first, so everything is read before ``path`` may be
    removed (a downloaded checkpoint). Raises
    :class:`~ckptstore.errors.ResumeError` when the model does not match the checkpoint.
    """
    prefix = os.path.join(path, WEIGHTS_PREFIX)
    try:
        if with_optimizer:
            _create_legacy_slots(model)
            prefix = _lasting_copy(model, prefix)
            status = model.load_weights(prefix)
        else:
            status = _weights_only_root(model).read(prefix)
            status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, KeyError, OSError) as exc:
        if with_optimizer and _weights_match(model, prefix):
            raise errors.ResumeError(
                f"Could not restore the optimizer state of {prefix} into this model's optimizer "
                f"({type(model.optimizer).__name__}): {exc}. Compile the model with the same "
                "optimizer it was saved with."
            ) from exc
        raise OtherModelError(
            f"Could not load {prefix} into this model: {exc}. The model (layers, shapes) must "
            "be the one the checkpoint was saved from."
        ) from exc


class OtherModelError(errors.ResumeError):
    """The model's own weights do not fit a Keras 2 checkpoint: another model's. TensorFlow's
    text may list unmatched variables with their values; DeterminedCallback says instead which
    checkpoint holds which model (``keras_io.fit._fit_log.other_model``)."""


def _lasting_copy(model: KerasModel, prefix: str) -> str:
    """A copy of the checkpoint files at ``prefix`` that lives as long as ``model``.

    TensorFlow restores the slots of an optimizer not built yet (a GAN's own optimizers, which
    build at their first step) when they are created, reading the files then: a downloaded
    checkpoint's temporary folder is gone by that time. Hard links where possible."""
    import shutil
    import tempfile
    import weakref

    folder = tempfile.mkdtemp(prefix="ckptstore-deferred-restore-")
    base = os.path.basename(prefix)
    for name in os.listdir(os.path.dirname(prefix)):
        if name.startswith(base + ".") or name == "checkpoint":
            source = os.path.join(os.path.dirname(prefix), name)
            try:
                os.link(source, os.path.join(folder, name))
            except OSError:
                shutil.copy2(source, os.path.join(folder, name))
    weakref.finalize(model, shutil.rmtree, folder, True)
    return os.path.join(folder, base)


def _weights_match(model: KerasModel, prefix: str) -> bool:
    """Whether the model's own weights (not its optimizer) restore from ``prefix``."""
    try:
        status = _weights_only_root(model).read(prefix)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, KeyError, OSError):
        return False
    return True


def script_classes(config_json: str | None) -> list[str]:
    """Custom classes ``config_json`` names that live in the training script (``__main__``:
    Keras records them with ``"module": null``), which no other process can import."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "class_name" in node and "module" in node:
                if node.get("registered_name") and node.get("module") in (None, "__main__"):
                    found.add(str(node.get("registered_name")))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    try:
        walk(json.loads(config_json or "null"))
    except ValueError:
        return []
    return sorted(found)


def worker_export_blocker(model: KerasModel, config_json: str | None) -> str | None:
    """Why a separate process could not rebuild ``model`` (config ``config_json``) to export
    its SavedModel, or None when it can.

    It cannot for a subclassed model (no config, or one that does not describe its layers), a
    model not built yet when ``fit()`` starts (no input shape: its config has none either), or
    when the config names classes or functions of the training script itself (``__main__``:
    Keras 2 records them with ``"module": null``), which another process cannot import.
    ``DeterminedCallback`` then exports on the training thread (see
    :mod:`ckptstore.keras_io.exporting`)."""
    if config_json is None or not getattr(model, "_is_graph_network", False):
        return "the model is subclassed (its config does not describe its layers)"
    if not getattr(model, "built", False):
        return "the model is not built when fit() starts (give it an input shape)"
    try:
        json.loads(config_json)
    except ValueError:
        return "the model config is not JSON"
    found = script_classes(config_json)
    if found:
        return f"the model uses {sorted(found)} defined in the training script (__main__)"
    return None


def export_saved_model(model: KerasModel, path: str) -> None:
    """The inference SavedModel of a Keras 2 model (``model.save(..., save_format="tf")``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save(path, save_format="tf", include_optimizer=False)


class _StartAt:
    """What Keras 2's ``fit()`` asks for its first epoch (the hook ``BackupAndRestore`` uses)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: Any, initial_epoch: int, mode: Any = None
    ) -> tuple[int, int]:
        return self.epoch, 0

    def maybe_load_initial_epoch_from_ckpt(self, initial_epoch: int, mode: Any = None) -> int:
        return self.epoch


# ---- layer RNGs: Keras 2 keeps them out of its checkpoints ------------------------------------
#: Key of the layers' generator states in ``callback_state.json``'s ``rng``.
LAYER_RNG_KEY = "tf_keras_layer_generators"


def _random_layers(model: KerasModel) -> list[Any]:
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=False, recursive=True)) if flatten else []
    return [layer for layer in layers if getattr(layer, "_random_generator", None) is not None]


def capture_layer_rng(model: KerasModel) -> dict[str, Any]:
    """The ``tf.random.Generator`` states of Keras 2 layers (``Dropout``, noise layers...).

    Keras 2 leaves them out of ``save_weights`` on purpose; without them a resumed run draws
    different dropout masks. Layers on Keras 2's default legacy stateful RNG have no state to
    save (see :func:`legacy_rng_layers`). Empty on Keras 3 (its seed generators are variables).
    """
    from ckptstore.keras_io import backend

    if not backend.IS_KERAS2:
        return {}
    states = []
    for layer in _random_layers(model):
        generator = getattr(layer._random_generator, "_generator", None)
        states.append(None if generator is None else generator.state.numpy().tolist())
    return {LAYER_RNG_KEY: states} if any(s is not None for s in states) else {}


def restore_layer_rng(model: KerasModel, rng: Mapping[str, Any]) -> None:
    """Put back what :func:`capture_layer_rng` recorded, layer by layer in model order."""
    import numpy as np

    states = rng.get(LAYER_RNG_KEY)
    if not states:
        return
    layers = _random_layers(model)
    if len(layers) != len(states):
        logger.warning(
            "Checkpoint has RNG state for %d random layers, the model has %d; not restored.",
            len(states),
            len(layers),
        )
        return
    for layer, state in zip(layers, states, strict=True):
        generator = getattr(layer._random_generator, "_generator", None)
        if state is not None and generator is not None:
            generator.reset(np.asarray(state, dtype=np.int64))


def legacy_rng_layers(model: KerasModel) -> list[str]:
    """Names of Keras 2 layers drawing from TensorFlow's legacy stateful RNG ops (no state)."""
    return [
        layer.name
        for layer in _random_layers(model)
        if getattr(layer._random_generator, "_rng_type", None) == "legacy_stateful"
    ]


# ---- one call for either Keras (what DeterminedCallback uses) ---------------------------------
def layout_of(model: KerasModel) -> Any:
    """The save layout of ``model`` for the running Keras (built once per model)."""
    from ckptstore.keras_io import backend
    from ckptstore.keras_io.saving import _snapshot as snapshot

    if not backend.IS_KERAS2:
        return snapshot.StateLayout.of(model)
    legacy = legacy_rng_layers(model)
    if legacy:
        logger.warning(
            "Layers %s draw from TensorFlow's legacy stateful RNG (Keras 2's default), whose "
            "state cannot be saved: a resumed run will not be bit-exact. Call "
            "tf.keras.backend.experimental.enable_tf_random_generator() before building the "
            "model to make their RNG state part of every checkpoint.",
            legacy,
        )
    return Keras2Layout.of(model)


def snapshot_of(layout: Any) -> Any:
    """A point-in-time snapshot of ``layout``'s model, for the writer thread."""
    from ckptstore.keras_io.saving import _snapshot as snapshot

    if isinstance(layout, Keras2Layout):
        return take_snapshot(layout)
    return snapshot.take_snapshot(layout)


def set_initial_epoch(model: KerasModel, epoch: int | None) -> None:
    """Make the next ``fit()`` start at ``epoch`` (None: as ``fit`` was asked)."""
    from ckptstore.keras_io import backend

    if backend.IS_KERAS2:
        model._training_state = None if epoch is None else _StartAt(epoch)
    else:
        model._initial_epoch = epoch


def determined_layout(path: str) -> str | None:
    """The Determined layout of folder ``path`` (None: not one of Determined's)."""
    from ckptstore.import_determined.layouts import detect_layout

    return detect_layout(os.listdir(path))


def load_determined(model: KerasModel, path: str, *, with_optimizer: bool) -> None:
    """Load Determined checkpoint folder ``path`` into ``model`` through the migration code."""
    from ckptstore.import_determined.weights import load_determined_checkpoint

    try:
        load_determined_checkpoint(model, path, load_optimizer=with_optimizer)
    except errors.ModelLoadError as exc:
        raise errors.ResumeError(f"Determined checkpoint {path}: {exc}") from exc


def load_into(model: KerasModel, path: str, *, with_optimizer: bool) -> None:
    """Restore a Keras 2 checkpoint folder into ``model``, whichever Keras is running."""
    from ckptstore.keras_io import backend

    if not has_weights(path):
        raise errors.ResumeError(
            f"Checkpoint folder {path} has no {WEIGHTS_PREFIX}.index: it was written by Keras 3 "
            f"(model.keras), which Keras 2 cannot read. Received: {sorted(os.listdir(path))}. "
            f"Resume it with Keras 3 (unset {backend.LEGACY_ENV}) or pass checkpoint=None."
        )
    if backend.IS_KERAS2:
        load_weights(model, path, with_optimizer=with_optimizer)
        return
    from ckptstore.import_determined.weights import load_determined_checkpoint

    try:
        load_determined_checkpoint(model, path, load_optimizer=with_optimizer)
    except errors.ModelLoadError as exc:
        raise errors.ResumeError(f"Keras 2 checkpoint {path} into Keras 3: {exc}") from exc


def load_model(
    path: str,
    *,
    compile: bool,
    custom_objects: Mapping[str, Any] | None,
    safe_mode: bool = True,
    modules: Sequence[str] = (),
) -> KerasModel:
    """A Keras 2 model from a Keras 2 checkpoint folder.

    ``model_config.json`` + ``model_checkpoint`` when the checkpoint has its compile arguments
    (``training_config.json``): the model comes back compiled with its optimizer state, like a
    ``.keras`` file on Keras 3. Else, or when the config names a layer class this process does
    not know, the SavedModel when there is one (Keras revives custom layers from their traced
    graphs, without their Python class, as Determined's SavedModel loads did; not compiled).
    A Python ``lambda`` in a ``Lambda`` layer is refused
    (:class:`~ckptstore.errors.UnsafeCheckpointContent`) unless ``safe_mode=False``, and so is
    a config naming code the caller did not allow (``modules=``, ``custom_objects=``;
    :class:`~ckptstore.errors.UntrustedCode`): Keras 2 imports any module a config names."""
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    from ckptstore.keras_io.backend import keras
    from ckptstore.keras_io.saving._code_refs import (
        check_code_refs,
        import_allowed,
        imported_objects,
    )

    objects = dict(custom_objects) if custom_objects else None
    config = os.path.join(path, MODEL_CONFIG_FILENAME)
    if os.path.isfile(config):  # the same model as the SavedModel's metadata: checked first
        with open(config, "rb") as f:
            raw = f.read()
        allowed = check_code_refs(raw, what=config, modules=modules, custom_objects=custom_objects)
        import_allowed(allowed, config)
        # classes of modules already imported: handed over (tf_keras looks them up by name)
        objects = {**imported_objects(raw), **(objects or {})} or None
    saved = os.path.join(path, "saved_model")
    has_saved = os.path.isfile(os.path.join(saved, "saved_model.pb"))
    compiled = os.path.isfile(os.path.join(path, TRAINING_CONFIG_FILENAME))
    if has_saved and not (compile and compiled and os.path.isfile(config)):
        return _load_saved_model(saved, compile, objects, safe_mode)
    if not os.path.isfile(config):
        raise errors.ModelLoadError(
            f"Keras 2 checkpoint {path} has weights but no {MODEL_CONFIG_FILENAME} or "
            "saved_model/ (a subclassed model): it holds weights and optimizer state only. "
            "Build the model in code and pass it: load_checkpoint_model(..., model=my_model) "
            f"(or model.load_weights('{os.path.join(path, WEIGHTS_PREFIX)}'))."
        )
    with open(config, encoding="utf-8") as f:
        text = f.read()
    try:
        with SafeModeScope(safe_mode):
            model = keras2_lookups.model_from_config_json(text, objects)
    except (ValueError, TypeError) as exc:
        _raise_if_unsafe(path, exc)
        if has_saved:
            logger.warning(
                "Keras 2 could not rebuild the model of %s from its config (%s); loading its "
                "SavedModel instead (not compiled). Pass custom_objects= to get it compiled.",
                path,
                exc,
            )
            return _load_saved_model(saved, compile, objects, safe_mode)
        raise errors.ModelLoadError(
            f"Keras 2 could not rebuild the model of {path}: {exc}. Pass custom_objects= for "
            "custom layers; or, when its config cannot rebuild it (a model subclass whose "
            "__init__ its get_config() does not describe), build the model in code and pass "
            "it: load_checkpoint_model(..., model=build_model)."
        ) from exc
    if not isinstance(model, keras.Model):
        # tf_keras writes {"class_name": "MyModel", "config": {}} for a subclassed model whose
        # __init__ takes objects, and rebuilds it as the string "MyModel"
        raise errors.ModelLoadError(
            f"{path} holds the weights of a subclassed model ({model!r}) that Keras 2 cannot "
            "rebuild from its config (its get_config() is missing or incomplete). Build the "
            "model with your code and pass it: load_model_from_checkpoint_path(path, "
            "model=model); a TFKerasTrial checkpoint is built by its trial class when its "
            "module is imported (or allowed with modules=)."
        )
    if compile and _compile_as_saved(model, path, objects, safe_mode, modules):
        load_weights(model, path, with_optimizer=True)
    else:
        model.load_weights(os.path.join(path, WEIGHTS_PREFIX)).expect_partial()
    return model


def _load_saved_model(
    saved: str, compile: bool, objects: dict[str, Any] | None, safe_mode: bool
) -> KerasModel:
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    from ckptstore.keras_io.backend import keras

    try:
        with SafeModeScope(safe_mode):
            return keras.models.load_model(saved, compile=compile, custom_objects=objects)
    except (ValueError, TypeError, OSError) as exc:
        _raise_if_unsafe(saved, exc)
        raise errors.ModelLoadError(f"Keras 2 could not load {saved}: {exc}") from exc


def _compile_as_saved(
    model: KerasModel,
    path: str,
    objects: dict[str, Any] | None,
    safe_mode: bool,
    modules: Sequence[str] = (),
) -> bool:
    """Compile ``model`` with the checkpoint's training config and create its optimizer's
    variables (so they are restored now, while ``path`` exists); False when it has none."""
    from tf_keras.src.saving.legacy import saving_utils
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    file = os.path.join(path, TRAINING_CONFIG_FILENAME)
    if not os.path.isfile(file):
        return False  # written before this file existed, or by Determined: uncompiled
    from ckptstore.keras_io.saving._code_refs import check_code_refs, import_allowed

    with open(file, "rb") as f:
        raw = f.read()
    # The losses, metrics and optimizer it names pass the same rule as the model config.
    import_allowed(check_code_refs(raw, what=file, modules=modules, custom_objects=objects), file)
    training = json.loads(raw)
    try:
        with SafeModeScope(safe_mode):
            args = saving_utils.compile_args_from_training_config(training, objects)
            model.compile(**args, jit_compile=training.get("jit_compile"))
    except (ValueError, TypeError) as exc:
        raise errors.ModelLoadError(
            f"Keras 2 could not compile the model of {path} as it was saved: {exc}. Pass "
            "custom_objects= for custom losses/metrics/optimizers, or compile=False; a model "
            "whose own compile() takes other arguments: build and compile it in code and pass "
            "it, load_checkpoint_model(..., model=build_model)."
        ) from exc
    build = getattr(model.optimizer, "build", None)
    if callable(build) and not hasattr(model.optimizer, "_create_all_weights"):
        build(model.trainable_variables)  # Keras 2.11+ optimizers create variables lazily
    return True


def _raise_if_unsafe(path: str, exc: Exception) -> None:
    message = str(exc)
    if "safe_mode" in message and ("Lambda" in message or "lambda" in message):
        raise errors.UnsafeCheckpointContent(
            f"{path} contains a Lambda layer holding Python bytecode, which could run arbitrary "
            "code, so it was not loaded. If you trust this checkpoint, pass safe_mode=False."
        ) from exc


def written_by_keras2(path: str) -> bool:
    """Whether the checkpoint folder ``path`` was written under Keras 2 (by its metadata)."""
    meta = os.path.join(path, "metadata.json")
    if os.path.isfile(meta):
        try:
            with open(meta, encoding="utf-8") as f:
                return str(json.load(f).get("keras_version", "")).startswith("2")
        except (OSError, ValueError):
            return False
    return False
