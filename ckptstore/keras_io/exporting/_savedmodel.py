"""One export: a Keras 3 ``.keras`` file (:func:`export_model_file`) or a Keras 2 checkpoint
folder (:func:`export_keras2_folder`) to a SavedModel, verified.

This is what the export worker process runs for each request, and what :func:`export_checkpoint`
runs in the calling process. **Verification**: the SavedModel is loaded back with
``tf.saved_model.load`` and its ``serve`` must give the Keras model's predictions
(``numpy.allclose``, rtol 1e-4, atol 1e-5) on a batch of two deterministic random inputs built
from the serving signature.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving._code_refs import check_code_refs, import_allowed, imported_objects

logger = logging.getLogger(__name__)

_RTOL, _ATOL = 1e-4, 1e-5


@dataclasses.dataclass
class ExportResult:
    """What one export did: where, how long, and how well ``serve`` matched Keras."""

    path: str
    seconds: float
    verified: bool
    max_abs_diff: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def custom_modules(config_json: str) -> list[str]:
    """Modules (other than Keras's own) named in a model config: they define custom layers and
    must be imported before the model can be loaded elsewhere."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            module = node.get("module")
            if isinstance(module, str) and not module.startswith(("keras", "builtins")):
                found.add(module)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(config_json))
    return sorted(found)


def export_model_file(
    model_path: str,
    out_dir: str,
    *,
    verify: bool = True,
    modules: Sequence[str] = (),
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Load the ``.keras`` file ``model_path``, ``model.export()`` it to ``out_dir`` and (with
    ``verify``) check that the SavedModel's ``serve`` predicts what the Keras model does.

    Raises :class:`~ckptstore.errors.ExportError` (what failed, and what to do)."""
    import keras

    started = time.perf_counter()
    _import_modules(_archive_config(model_path), modules, custom_objects, model_path)
    try:
        model = keras.saving.load_model(
            model_path, compile=False, safe_mode=safe_mode, custom_objects=custom_objects
        )
    except Exception as exc:
        hint = (
            " The model uses classes defined in the training script (__main__), which the "
            "export worker process cannot import: move them into a module, or train with "
            "export_saved_model='never' and run ckptstore.keras_io.exporting.export_checkpoint() "
            "where the classes are defined."
            if "__main__" in modules
            else ""
        )
        raise errors.ExportError(
            f"Could not load {model_path} to export it: {type(exc).__name__}: {exc}.{hint}"
        ) from exc
    return _save_and_verify(
        lambda: export_once(model, out_dir),
        f"model.export() failed for {model_path}",
        (lambda: _verify(model, out_dir)) if verify else None,
        out_dir,
        started,
    )


def export_once(model: KerasModel, out_dir: str) -> None:
    """``model.export(out_dir)``, storing each variable's tensor once.

    Keras 3's export on the TensorFlow backend tracks every variable twice: the Keras
    variables in the archive's ``variables`` lists, and the ``tf.Variable`` inside each that
    the ``serve`` function captures; a SavedModel stores both, so ``variables/`` is twice the
    weights. Here the lists hold those same ``tf.Variable`` objects (``reloaded.variables``
    still lists every variable). Any other backend or Keras layout: ``model.export()`` as is."""
    import keras
    import tensorflow as tf

    try:
        from keras.src.export.export_utils import get_input_signature

        archive = keras.export.ExportArchive()
        tracked = archive._tf_trackable
    except (ImportError, AttributeError):
        tracked = None
    if tracked is None or keras.backend.backend() != "tensorflow":
        model.export(out_dir, verbose=False)
        return
    archive.track_and_add_endpoint("serve", model, get_input_signature(model))

    def backing(variable: Any) -> Any:
        inner = getattr(variable, "_value", None)
        return inner if isinstance(inner, tf.Variable) else variable

    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        listed = getattr(tracked, name, None)
        if listed is not None:
            setattr(tracked, name, [backing(v) for v in listed])
    archive.write_out(out_dir, verbose=False)


def _save_and_verify(
    save: Callable[[], Any],
    failed: str,
    check: Callable[[], float] | None,
    out_dir: str,
    started: float,
) -> ExportResult:
    """Write the SavedModel (``save``), then compare its predictions (``check``): the last two
    steps of both Keras versions' exports."""
    try:
        save()
    except Exception as exc:
        raise errors.ExportError(
            f"{failed}: {type(exc).__name__}: {exc}. The model cannot be served as a "
            "SavedModel as it is; use export_saved_model='never'."
        ) from exc
    return ExportResult(
        path=out_dir,
        seconds=time.perf_counter() - started,
        verified=check is not None,
        max_abs_diff=check() if check is not None else None,
    )


def _import_modules(
    config: str | bytes,
    modules: Sequence[str],
    custom_objects: Mapping[str, Any] | None,
    what: str,
) -> list[str]:
    """Check the code the model config names against the caller's ``modules`` allow-list and
    ``custom_objects`` (:func:`~ckptstore.keras_io.saving._code_refs.check_code_refs`: raises
    UntrustedCode, nothing imported), then import the allowed modules (they register the
    custom layers)."""
    allowed = check_code_refs(config, what=what, modules=modules, custom_objects=custom_objects)
    try:
        import_allowed(allowed, what)
    except errors.ModelLoadError as exc:
        raise errors.ExportError(str(exc)) from exc
    return allowed


def _archive_config(model_path: str) -> bytes:
    """A ``.keras`` file's ``config.json``."""
    import zipfile

    try:
        with zipfile.ZipFile(model_path) as archive:
            return archive.read("config.json")
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise errors.ExportError(
            f"{model_path} is not a readable .keras file ({exc}); the checkpoint is damaged or "
            "was not written by Keras 3."
        ) from exc


def export_keras2_folder(
    folder: str,
    out_dir: str,
    *,
    verify: bool = True,
    modules: Sequence[str] = (),
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``) only: rebuild the model of the Keras 2
    checkpoint folder ``folder`` from its ``model_config.json``, load its ``model_checkpoint``
    weights, write the SavedModel the training thread used to write
    (:func:`~ckptstore.keras_io.saving._keras2_format.export_saved_model`: ``model.save(out_dir,
    save_format="tf")``, signature ``serving_default``, loadable by
    ``tf.keras.models.load_model``) and (with ``verify``) check that ``serving_default``
    predicts what the rebuilt model does.

    Raises :class:`~ckptstore.errors.ExportError` (what failed, and what to do)."""
    from ckptstore.keras_io import backend
    from ckptstore.keras_io.saving import _keras2_format as keras2_format
    from ckptstore.keras_io.saving import _keras2_lookups as keras2_lookups

    if not backend.IS_KERAS2:
        raise errors.ExportError(
            f"{folder} is a Keras 2 checkpoint; its SavedModel must be exported by Keras 2 "
            f"(tf_keras with {backend.LEGACY_ENV}=1), but tf.keras is {backend.FRAMEWORK} here."
        )
    started = time.perf_counter()
    config_path = os.path.join(folder, keras2_format.MODEL_CONFIG_FILENAME)
    if not os.path.isfile(config_path):
        raise errors.ExportError(
            f"{folder} has no {keras2_format.MODEL_CONFIG_FILENAME} (the model has no config: a "
            "subclassed model), so the model cannot be rebuilt to export it. Build the model in "
            "code, model.load_weights(<checkpoint>/model_checkpoint) and model.save(path, "
            "save_format='tf')."
        )
    with open(config_path, encoding="utf-8") as f:
        config_json = f.read()
    if _keras2_subclassed(config_json):
        raise errors.ExportError(_SUBCLASSED_HINT.format(what=folder))
    allowed = _import_modules(config_json, modules, custom_objects, config_path)
    from tf_keras.src.saving import serialization_lib

    # Keras 2 finds only registered classes by name: hand it the unregistered ones of the
    # allowed modules and of modules this process already imported (check_code_refs let both).
    objects = {
        **imported_objects(config_json),
        **_module_classes(config_json, allowed),
        **dict(custom_objects or {}),
    }
    try:
        with serialization_lib.SafeModeScope(safe_mode):
            model = keras2_lookups.model_from_config_json(config_json, objects or None)
    except Exception as exc:
        hint = (
            " The model uses classes or functions defined in the training script (__main__), "
            "which the export worker process cannot import: move them into a module."
            if "__main__" in modules or '"module": null' in config_json
            else " Pass custom_objects= or make the modules defining custom layers importable."
        )
        raise errors.ExportError(
            f"Keras 2 could not rebuild the model of {folder} to export it: "
            f"{type(exc).__name__}: {exc}.{hint}"
        ) from exc
    prefix = os.path.join(folder, keras2_format.WEIGHTS_PREFIX)
    try:
        status = model.load_weights(prefix)
        status.expect_partial()  # the optimizer's state is not part of a SavedModel
        status.assert_existing_objects_matched()
    except Exception as exc:
        raise errors.ExportError(
            f"Could not load {prefix} into the model rebuilt from its config: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    return _save_and_verify(
        lambda: keras2_format.export_saved_model(model, out_dir),
        f"model.save(save_format='tf') failed for {folder}",
        (lambda: _verify_keras2(model, out_dir)) if verify else None,
        out_dir,
        started,
    )


_SUBCLASSED_HINT = (
    "The model of {what} is a subclassed Keras 2 model (its config does not describe its "
    "layers), which cannot be rebuilt to export it. Build the model in code under Keras 2, "
    "model.load_weights(<checkpoint>/model_checkpoint) and model.save(path, save_format='tf')."
)


def _keras2_subclassed(config_json: str) -> bool:
    """Whether a Keras 2 ``model.to_json()`` is a subclassed model's (no ``layers``)."""
    try:
        config = json.loads(config_json).get("config")
    except (ValueError, AttributeError):
        return True
    return not isinstance(config, dict) or "layers" not in config


def _module_classes(config_json: str, allowed: Sequence[str]) -> dict[str, Any]:
    """``{name: class}`` of the custom classes and functions a Keras 2 model config names with
    their allow-listed (already imported) module: Keras 2, unlike Keras 3, does not look them
    up there."""
    found: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            module, name = node.get("module"), node.get("class_name")
            if (
                isinstance(module, str)
                and isinstance(name, str)
                and module in allowed
                and module in sys.modules
            ):
                value = getattr(sys.modules[module], name, None)
                if value is not None:
                    found[name] = value
                    registered = node.get("registered_name")
                    if isinstance(registered, str) and registered:
                        found.setdefault(registered, value)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(config_json))
    return found


def _sample_inputs(spec_tree: Any) -> Any:
    """Two deterministic random rows for every input of a serving signature."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def sample(spec: Any) -> Any:
        shape = [2 if d is None else int(d) for d in spec.shape.as_list()]
        dtype = spec.dtype
        if dtype.is_floating:
            return tf.constant(rng.standard_normal(shape), dtype=dtype)
        if dtype.is_integer or dtype.is_bool:
            return tf.zeros(shape, dtype=dtype)
        return tf.fill(shape, tf.constant("", dtype=dtype))

    return tf.nest.map_structure(sample, spec_tree)


def _compare(got_flat: list[Any], want_flat: list[Any], out_dir: str) -> float:
    """Largest |got - want|; ExportError if the outputs differ beyond tolerance."""
    import numpy as np

    if len(got_flat) != len(want_flat):
        raise errors.ExportError(
            f"The SavedModel in {out_dir} returns {len(got_flat)} outputs, the Keras model "
            f"{len(want_flat)}; the export is not faithful. Do not serve it."
        )
    worst = 0.0
    for g, w in zip(got_flat, want_flat, strict=True):
        if g.shape != w.shape or not np.allclose(g, w, rtol=_RTOL, atol=_ATOL):
            diff = float(np.max(np.abs(g.astype("float64") - w.astype("float64"))))
            raise errors.ExportError(
                f"The SavedModel in {out_dir} predicts differently from the Keras model (max "
                f"|diff| {diff:.3g}, shapes {g.shape} vs {w.shape}); do not serve it."
            )
        if g.size:
            worst = max(worst, float(np.max(np.abs(g.astype("float64") - w.astype("float64")))))
    return worst


def _verify_keras2(model: KerasModel, out_dir: str) -> float:
    """:func:`_verify` for a Keras 2 SavedModel: its ``serving_default`` signature."""
    import numpy as np
    import tensorflow as tf

    loaded = tf.saved_model.load(out_dir)
    signature = loaded.signatures.get("serving_default")
    if signature is None:
        raise errors.ExportError(f"The SavedModel in {out_dir} has no 'serving_default' signature.")
    _args, kwargs = signature.structured_input_signature
    inputs = _sample_inputs(kwargs)
    got = signature(**inputs)
    names = list(getattr(model, "input_names", None) or [])
    if len(inputs) == 1:
        model_in: Any = next(iter(inputs.values()))
    elif sorted(names) == sorted(inputs):
        model_in = [inputs[n] for n in names]
    else:
        model_in = inputs
    expected = tf.nest.flatten(model(model_in, training=False))
    outputs = list(getattr(model, "output_names", None) or [])
    keys = outputs if sorted(outputs) == sorted(got) else sorted(got)
    got_flat = [np.asarray(got[k]) for k in keys]
    return _compare(got_flat, [np.asarray(t) for t in expected], out_dir)


def _verify(model: KerasModel, out_dir: str) -> float:
    """Largest |serve - keras| over a sample batch; ExportError if beyond tolerance."""
    import numpy as np
    import tensorflow as tf

    loaded = tf.saved_model.load(out_dir)
    serve = getattr(loaded, "serve", None)
    if serve is None:
        raise errors.ExportError(
            f"The SavedModel in {out_dir} has no 'serve' endpoint; it was not written by "
            "model.export()."
        )
    functions = list(getattr(serve, "concrete_functions", []) or [])
    if not functions:
        raise errors.ExportError(f"The SavedModel in {out_dir} has an empty 'serve' endpoint.")
    args, kwargs = functions[0].structured_input_signature
    sample_args, sample_kwargs = _sample_inputs((args, kwargs))
    got = serve(*sample_args, **sample_kwargs)
    expected = model(*sample_args, **sample_kwargs, training=False)
    got_flat = [np.asarray(t) for t in tf.nest.flatten(got)]
    want_flat = [np.asarray(t) for t in tf.nest.flatten(expected)]
    return _compare(got_flat, want_flat, out_dir)
