"""Inference SavedModels (``model.export()``) for checkpoints, built off the training thread.

Which checkpoints get one is an :class:`ExportPolicy` (``DeterminedCallback(...,
export_saved_model=...)``): ``"final"`` (default), ``"every"``, ``"best"`` or ``"never"``.

**Where the export runs: a worker process.** The training thread only takes the in-memory
snapshot it takes for every checkpoint. The callback's writer thread writes ``model.keras`` from
that snapshot into the checkpoint's staging folder and then asks an :class:`ExportWorker` — a
separate Python process started on the first export and kept for the rest of the run — to load
that file, call ``model.export()`` and verify the result. The checkpoint is committed only after
the worker answered "verified", so the manifest lists (and checksums) ``saved_model/``; a failed
export means no commit and a :class:`~ckptstore.errors.BackgroundUploadError` from ``fit()``.

Why a process and not a thread in the training process:

- ``model.export()`` traces the model's ``call`` into a ``tf.function`` and reads every variable.
  Tracing the *training* model from another thread while ``fit()`` updates its variables would
  capture a mix of two steps' weights, and TensorFlow/Keras trace-time state (name scopes, the
  Keras global state, ``clear_session()``) is not meant to be shared with a running ``fit()``.
- Even a private copy of the model traced in a thread holds the GIL for most of a trace (pure
  Python), so it would stall the training thread's Python for about as long as the export.
- A process has its own interpreter, TensorFlow runtime and memory: it cannot touch training
  state, runs at a lower CPU priority (``nice``), with one TensorFlow thread, without GPUs
  (``CUDA_VISIBLE_DEVICES=-1``: a second runtime must not take GPU memory from training), and a
  crash or out-of-memory in it fails that one export, not the training.

The cost is the worker's start (importing TensorFlow, a few CPU seconds, once per run) and
its memory (a second copy of the model while exporting). The worker imports the modules the
model config names for custom layers; classes defined in the training script itself
(``__main__``) cannot be found there: move them into a module, or train with
``export_saved_model="never"`` and export later with :func:`export_checkpoint` in a process
that has them.

**Keras 2** (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``): the same, with a worker started with
``TF_USE_LEGACY_KERAS=1``. The writer thread writes the Keras 2 checkpoint (``model_checkpoint.*``
+ ``model_config.json``) from the snapshot; the worker rebuilds the model from the config
(importing the modules it names, unregistered classes included), loads the weights and writes
the SavedModel the training thread used to write (:func:`export_keras2_folder`:
``model.save(path, save_format="tf")``, signature ``serving_default``, readable by
``tf.keras.models.load_model``), verified against the rebuilt model. A model no other process can
rebuild — subclassed (its config does not describe its layers), not built when ``fit()`` starts,
or using classes/functions of the training script (``__main__``) — is detected when ``fit()``
starts (:func:`~ckptstore.keras_io.keras2_format.worker_export_blocker`) and, as documented
fallback, exported on the training thread as before, with a warning saying why; any other
failure in the worker fails the checkpoint as on Keras 3. :func:`export_checkpoint` of a Keras 2
checkpoint exports in the calling process when it runs Keras 2, else in a Keras 2 worker.

**Verification**: the worker loads the export back with ``tf.saved_model.load`` and checks that
``serve`` gives the Keras model's predictions (``numpy.allclose``, rtol 1e-4, atol 1e-5) on a
batch of two deterministic random inputs built from the serving signature.

**Adding a SavedModel later**: :func:`export_checkpoint` (``ckptstore checkpoint export UUID``)
exports a committed checkpoint's ``model.keras`` in the calling process and adds
``saved_model/`` to the same checkpoint with :mod:`ckptstore.checkpointing.amend`.

Example::

    from ckptstore.keras_io import export
    result = export.export_model_file("ckpt/model.keras", "ckpt/saved_model")
    print(result.max_abs_diff)
    export.export_checkpoint("0b7c...", storage="s3://bucket/ckpts")
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec

logger = logging.getLogger(__name__)

#: Folder of the inference SavedModel inside a checkpoint.
SAVED_MODEL_DIRNAME = "saved_model"
MODEL_FILENAME = "model.keras"
MODES = ("final", "every", "best", "never")
#: Older spelling accepted for ``"every"``.
_ALIASES = {"all": "every"}
_RTOL, _ATOL = 1e-4, 1e-5


# ---- which checkpoints ----------------------------------------------------------------------------
@dataclasses.dataclass
class ExportPolicy:
    """Which checkpoints get an inference SavedModel (``saved_model/``).

    - ``"final"``: the checkpoint at the end of training (not a preemption's);
    - ``"every"``: every checkpoint;
    - ``"best"``: a checkpoint whose ``metric`` is better than every earlier checkpoint's of the
      run (carried across a resume); ``metric`` defaults to ``val_loss``, or ``loss`` when
      ``fit()`` has no validation data;
    - ``"never"``: none (add one later with ``ckptstore checkpoint export UUID``).

    Example::

        DeterminedCallback(ctx, None, 1, export_saved_model=ExportPolicy(
            "best", metric="val_accuracy", smaller_is_better=False))
    """

    mode: str = "final"
    metric: str | None = None
    smaller_is_better: bool = True
    #: Best value of ``metric`` among this run's checkpoints so far (``"best"`` only).
    best: float | None = None

    def __post_init__(self) -> None:
        mode = _ALIASES.get(self.mode, self.mode) if isinstance(self.mode, str) else self.mode
        if mode not in MODES:
            raise errors.InvalidConfig(
                f"export_saved_model must be one of {MODES} or an ExportPolicy. "
                f"Received: export_saved_model={self.mode!r}"
            )
        self.mode = mode
        if self.metric is not None and not isinstance(self.metric, str):
            raise errors.InvalidConfig(
                f"ExportPolicy metric must be a metric name. Received: metric={self.metric!r}"
            )

    @classmethod
    def coerce(cls, value: str | ExportPolicy) -> ExportPolicy:
        """An :class:`ExportPolicy` from a mode name or a policy (copied)."""
        if isinstance(value, ExportPolicy):
            return dataclasses.replace(value)
        return cls(value)

    def wants(self, *, final: bool, metrics: Mapping[str, Any]) -> bool:
        """Whether the checkpoint being saved gets a SavedModel; updates ``best``."""
        if self.mode == "never":
            return False
        if self.mode == "every":
            return True
        if self.mode == "final":
            return final
        name = self.metric or ("val_loss" if "val_loss" in metrics else "loss")
        value = metrics.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            logger.warning(
                "export_saved_model='best': this checkpoint has no metric %r (has %s); no export.",
                name,
                sorted(metrics),
            )
            return False
        value = float(value)
        better = self.best is None or (
            value < self.best if self.smaller_is_better else value > self.best
        )
        if better:
            self.best = value
        return better

    def metadata(self) -> dict[str, Any]:
        """What a checkpoint records so a resumed run continues the same policy."""
        return {} if self.mode != "best" else {"saved_model_best": self.best}

    def resume_from(self, metadata: Mapping[str, Any]) -> None:
        """Continue a run: take ``best`` from the resumed checkpoint's metadata."""
        value = metadata.get("saved_model_best")
        if self.mode == "best" and isinstance(value, (int, float)):
            self.best = float(value)


# ---- the export itself ----------------------------------------------------------------------------
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
    modules: list[str] | tuple[str, ...] = (),
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Load the ``.keras`` file ``model_path``, ``model.export()`` it to ``out_dir`` and (with
    ``verify``) check that the SavedModel's ``serve`` predicts what the Keras model does.

    Raises :class:`~ckptstore.errors.ExportError` (what failed, and what to do)."""
    import keras

    started = time.perf_counter()
    _import_modules(modules, model_path)
    try:
        model = keras.saving.load_model(
            model_path, compile=False, safe_mode=safe_mode, custom_objects=custom_objects
        )
    except Exception as exc:
        hint = (
            " The model uses classes defined in the training script (__main__), which the "
            "export worker process cannot import: move them into a module, or train with "
            "export_saved_model='never' and run ckptstore.keras_io.export.export_checkpoint() "
            "where the classes are defined."
            if "__main__" in modules
            else ""
        )
        raise errors.ExportError(
            f"Could not load {model_path} to export it: {type(exc).__name__}: {exc}.{hint}"
        ) from exc
    return _save_and_verify(
        lambda: model.export(out_dir, verbose=False),
        f"model.export() failed for {model_path}",
        (lambda: _verify(model, out_dir)) if verify else None,
        out_dir,
        started,
    )


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


def _import_modules(modules: list[str] | tuple[str, ...], what: str) -> None:
    """Import the modules defining the model's custom layers (they register them)."""
    for name in modules:
        if name == "__main__":
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise errors.ExportError(
                f"Cannot import {name!r}, which defines layers of the model in {what}: "
                f"{exc}. Make the module importable (PYTHONPATH) where the export runs."
            ) from exc


def export_keras2_folder(
    folder: str,
    out_dir: str,
    *,
    verify: bool = True,
    modules: list[str] | tuple[str, ...] = (),
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``) only: rebuild the model of the Keras 2
    checkpoint folder ``folder`` from its ``model_config.json``, load its ``model_checkpoint``
    weights, write the SavedModel the training thread used to write
    (:func:`~ckptstore.keras_io.keras2_format.export_saved_model`: ``model.save(out_dir,
    save_format="tf")``, signature ``serving_default``, loadable by
    ``tf.keras.models.load_model``) and (with ``verify``) check that ``serving_default``
    predicts what the rebuilt model does.

    Raises :class:`~ckptstore.errors.ExportError` (what failed, and what to do)."""
    from ckptstore.keras_io import backend, keras2_format

    if not backend.IS_KERAS2:
        raise errors.ExportError(
            f"{folder} is a Keras 2 checkpoint; its SavedModel must be exported by Keras 2 "
            f"(tf_keras with {backend.LEGACY_ENV}=1), but tf.keras is {backend.FRAMEWORK} here."
        )
    keras = backend.keras
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
    _import_modules(modules, config_path)
    from tf_keras.src.saving import serialization_lib

    # Keras 2 finds only registered classes by name: hand it the modules' unregistered ones.
    objects = {**_module_classes(config_json), **dict(custom_objects or {})}
    try:
        with serialization_lib.SafeModeScope(safe_mode):
            model = keras.models.model_from_json(config_json, custom_objects=objects or None)
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


def _module_classes(config_json: str) -> dict[str, Any]:
    """``{name: class}`` of the custom classes and functions a Keras 2 model config names with
    their (already imported) module: Keras 2, unlike Keras 3, does not look them up there."""
    found: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            module, name = node.get("module"), node.get("class_name")
            if (
                isinstance(module, str)
                and isinstance(name, str)
                and not module.startswith(("keras", "tf_keras", "builtins"))
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


def _verify_keras2(model: Any, out_dir: str) -> float:
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


def _verify(model: Any, out_dir: str) -> float:
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


# ---- the worker process ---------------------------------------------------------------------------
class ExportWorker:
    """A child Python process that runs :func:`export_model_file` on request.

    Started on the first :meth:`export` and kept until :meth:`close`; requests go over its
    stdin/stdout as JSON lines (the child's own prints go to its stderr, kept in a file whose
    end is quoted in errors). Thread-safe: one request at a time.

    Example::

        worker = ExportWorker()
        worker.export("staging/model.keras", "staging/saved_model")
        worker.close()
    """

    def __init__(self, *, nice: int = 5, keras2: bool | None = None) -> None:
        self._nice = nice
        #: Whether the worker runs Keras 2 (``TF_USE_LEGACY_KERAS=1``) for Keras 2 checkpoints;
        #: None: the Keras this process runs.
        self._keras2 = keras2
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: Any = None
        self._lock = threading.Lock()
        #: Results of the exports done so far (for logs and benchmarks).
        self.results: list[ExportResult] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> subprocess.Popen[str]:
        keras2 = self._keras2
        if keras2 is None:
            from ckptstore.keras_io import backend

            keras2 = backend.IS_KERAS2
        env = dict(os.environ)
        if keras2:
            # The worker rebuilds the tf_keras model: tf.keras must be Keras 2 there too.
            env["TF_USE_LEGACY_KERAS"] = "1"
        else:
            import keras

            env.pop("TF_USE_LEGACY_KERAS", None)
            env.setdefault("KERAS_BACKEND", keras.backend.backend())
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = "-1"
        # The child finds what this process finds: the script's folder, the project, ...
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="ckptstore-export-")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckptstore.keras_io.export",
                "--worker",
                "--nice",
                str(self._nice),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            bufsize=1,
        )
        logger.info("Started the SavedModel export worker (pid %d)", proc.pid)
        return proc

    def start(self) -> None:
        """Start the process now (it imports TensorFlow while training goes on)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()

    def export(
        self, model_path: str, out_dir: str, *, modules: list[str] | None = None
    ) -> ExportResult:
        """Export ``model_path`` to ``out_dir`` in the worker and verify it; ExportError if not."""
        request = {
            "model": os.fspath(model_path),
            "out": os.fspath(out_dir),
            "modules": list(modules or []),
        }
        return self._request(request, model_path)

    def export_keras2(
        self,
        folder: str,
        out_dir: str,
        *,
        modules: list[str] | None = None,
        verify: bool = True,
        safe_mode: bool = False,
    ) -> ExportResult:
        """:func:`export_keras2_folder` of the Keras 2 checkpoint folder ``folder`` in the
        worker (which must run Keras 2: ``ExportWorker(keras2=True)`` or a Keras 2 process)."""
        request = {
            "keras2": os.fspath(folder),
            "out": os.fspath(out_dir),
            "modules": list(modules or []),
            "verify": verify,
            "safe_mode": safe_mode,
        }
        return self._request(request, folder)

    def _request(self, request: dict[str, Any], model_path: str) -> ExportResult:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:
                code = proc.wait()
                self._proc = None
                raise errors.ExportError(
                    f"The SavedModel export worker (pid {proc.pid}) exited with code {code} "
                    f"while exporting {model_path} (out of memory?). Its last output:\n"
                    f"{self._stderr_tail()}"
                )
        answer = json.loads(line)
        if not answer.get("ok"):
            raise errors.ExportError(str(answer.get("error")))
        result = ExportResult(**answer["result"])
        self.results.append(result)
        return result

    def _stderr_tail(self, limit: int = 3000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-limit:]

    def close(self) -> None:
        """Stop the worker (it finishes the request it is on first)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                with contextlib.suppress(OSError):
                    assert proc.stdin is not None
                    proc.stdin.close()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None


def _worker_main(nice: int) -> int:
    """The child side of :class:`ExportWorker`: serve requests until stdin closes."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything TensorFlow or Keras prints goes to stderr, not the protocol
    sys.stdout = sys.stderr
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            # safe_mode=False: the files were just written by the training process itself
            if request.get("keras2"):
                result = export_keras2_folder(
                    request["keras2"],
                    request["out"],
                    modules=request.get("modules") or [],
                    verify=bool(request.get("verify", True)),
                    safe_mode=bool(request.get("safe_mode", False)),
                )
            else:
                result = export_model_file(
                    request["model"],
                    request["out"],
                    modules=request.get("modules") or [],
                    safe_mode=False,
                )
            answer: dict[str, Any] = {"ok": True, "result": result.to_json()}
        except errors.ExportError as exc:
            answer = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            answer = {"ok": False, "error": f"Export failed: {type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(answer) + "\n")
    return 0


# ---- the callback's side ---------------------------------------------------------------------------
class CheckpointExports:
    """What ``DeterminedCallback`` uses: the policy, and the hook that exports a checkpoint in
    the worker process before the writer commits it.

    ``fit()`` does not wait for an export: when a checkpoint with an export is still being
    written at the end of ``fit()``, :meth:`detach` hands the writer and the worker over to a
    finisher that :meth:`wait`, the core context's ``close()``/``checkpoint.wait()`` and
    interpreter exit all run (whichever comes first does the waiting).

    Example::

        exports = CheckpointExports("every")
        job.before_commit = exports.hook(final=False, preempted=False, metrics=logs,
                                         config_json=layout.config_json)
    """

    def __init__(self, policy: str | ExportPolicy) -> None:
        self.policy = ExportPolicy.coerce(policy)
        self._worker: ExportWorker | None = None
        self._modules: tuple[str, list[str]] | None = None
        self._finishers: list[_Finisher] = []
        #: Whether a checkpoint with an export was handed to the writer since the last detach.
        self.submitted = False

    def hook(
        self,
        *,
        final: bool,
        preempted: bool,
        metrics: Mapping[str, Any],
        config_json: str,
        keras2: bool = False,
    ) -> Any:
        """The writer's ``before_commit`` for this checkpoint, or None if it gets no export.
        A preemption's checkpoint never does: the run must stop quickly, the resumed run's
        checkpoints export as the policy says. ``keras2``: the checkpoint is a Keras 2 one
        (``model_checkpoint.*`` + ``model_config.json``), exported by a Keras 2 worker."""
        if preempted or not self.policy.wants(final=final, metrics=metrics):
            return None
        if self._modules is None or self._modules[0] != config_json:
            self._modules = (config_json, custom_modules(config_json))
        modules = self._modules[1]
        if self._worker is None:
            self._worker = ExportWorker(keras2=keras2)
        worker = self._worker
        self.submitted = True

        def before_commit(path: str) -> None:
            out = os.path.join(path, SAVED_MODEL_DIRNAME)
            if keras2:
                result = worker.export_keras2(path, out, modules=modules)
            else:
                result = worker.export(os.path.join(path, MODEL_FILENAME), out, modules=modules)
            logger.info(
                "SavedModel exported and verified in %.2f s (max |serve - keras| %.2g)",
                result.seconds,
                result.max_abs_diff or 0.0,
            )

        return before_commit

    def prestart(self) -> None:
        """Start the worker at the beginning of ``fit()`` when most checkpoints may export
        (``"every"``, ``"best"``), so its start overlaps training instead of delaying the
        first export; ``"final"`` starts it at the final checkpoint."""
        if self.policy.mode in ("every", "best"):
            if self._worker is None:
                self._worker = ExportWorker()
            self._worker.start()

    def resume_from(self, checkpoint_context: Any, uuid: str) -> None:
        """Carry the ``"best"`` policy's best value over from the checkpoint resumed from."""
        if self.policy.mode != "best":
            return
        try:
            self.policy.resume_from(checkpoint_context.get_metadata(uuid))
        except errors.CkptstoreError as exc:
            logger.warning("Could not read the best exported metric of %s: %s", uuid, exc)

    def detach(self, writer: Any, checkpoint_context: Any) -> None:
        """Let ``writer`` (and the worker) finish in the background; see the class docstring."""
        finisher = _Finisher(writer, self._worker)
        self._worker = None
        self.submitted = False
        self._finishers.append(finisher)
        defer = getattr(checkpoint_context, "defer", None)
        if callable(defer):
            defer(finisher.wait)
        import atexit

        atexit.register(finisher.wait_quietly)

    def wait(self) -> None:
        """Block until every detached writer committed; raise the first failure."""
        finishers, self._finishers = self._finishers, []
        first: BaseException | None = None
        for finisher in finishers:
            try:
                finisher.wait()
            except BaseException as exc:  # noqa: BLE001 - raised below, after all finished
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        """Stop the worker of the current (not detached) writer."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


class _Finisher:
    """Waits once for a detached writer, then closes it and its export worker."""

    def __init__(self, writer: Any, worker: ExportWorker | None) -> None:
        self._writer = writer
        self._worker = worker
        self._lock = threading.Lock()
        self._done = False

    def wait(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                self._writer.wait()
            finally:
                self._writer.close()
                if self._worker is not None:
                    self._worker.close()

    def wait_quietly(self) -> None:
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - at interpreter exit there is no caller left
            logger.error("A checkpoint finishing at exit failed: %s", exc)


# ---- adding a SavedModel to a committed checkpoint --------------------------------------------
def export_checkpoint(
    checkpoint_uuid: str,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    verify: bool = True,
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Add an inference SavedModel (``saved_model/``) to committed checkpoint
    ``checkpoint_uuid``, in this process.

    Downloads and verifies its ``model.keras``, exports and verifies the SavedModel (``serve``
    predicts what Keras does), then adds the files to the same checkpoint with the manifest
    rewrite of :mod:`ckptstore.checkpointing.amend` (a crash at any point leaves the checkpoint
    readable, as before or with the SavedModel). The checkpoint is pinned against GC meanwhile.

    Args:
        checkpoint_uuid: the checkpoint (registry row, else looked for in storage).
        storage, registry: as for :func:`ckptstore.load_checkpoint_model`.
        verify: compare ``serve`` with the Keras model's predictions.
        safe_mode, custom_objects: as for ``keras.saving.load_model``.

    Raises:
        CheckpointNotFound, CheckpointConflict (it already has a SavedModel), ExportError,
        ChecksumMismatch (from :mod:`ckptstore.errors`).

    Example::

        from ckptstore.keras_io.export import export_checkpoint
        export_checkpoint("0b7c...", storage="s3://bucket/ckpts")
    """
    from ckptstore.checkpointing import amend
    from ckptstore.checkpointing import format as fmt
    from ckptstore.keras_io import keras2_format

    with _checkpoint_context(checkpoint_uuid, storage, registry) as ckpt:
        manifest = fmt.read_manifest(ckpt.storage, checkpoint_uuid)
        prefix = SAVED_MODEL_DIRNAME + "/"
        if any(rel.startswith(prefix) for rel in manifest["files"]):
            raise errors.CheckpointConflict(
                f"Checkpoint {checkpoint_uuid} already has a {SAVED_MODEL_DIRNAME}/; nothing to "
                "do. To export again, delete it first: ckptstore checkpoint delete "
                f"{checkpoint_uuid} --glob '{SAVED_MODEL_DIRNAME}/*'"
            )
        keras2 = (
            MODEL_FILENAME not in manifest["files"]
            and keras2_format.WEIGHTS_PREFIX + ".index" in manifest["files"]
        )
        if keras2 and keras2_format.MODEL_CONFIG_FILENAME not in manifest["files"]:
            raise errors.ModelLoadError(
                f"Keras 2 checkpoint {checkpoint_uuid} has no "
                f"{keras2_format.MODEL_CONFIG_FILENAME} (a subclassed model), so its model "
                "cannot be rebuilt to export it. Build the model in code under Keras 2, "
                f"model.load_weights(<checkpoint>/{keras2_format.WEIGHTS_PREFIX}) and "
                "model.save(path, save_format='tf')."
            )
        if not keras2 and MODEL_FILENAME not in manifest["files"]:
            raise errors.ModelLoadError(
                f"Checkpoint {checkpoint_uuid} has no {MODEL_FILENAME} to export (files: "
                f"{sorted(manifest['files'])[:10]}); only checkpoints written by "
                "DeterminedCallback / TFKerasTrial can be exported."
            )
        selector: Any = MODEL_FILENAME
        if keras2:
            selector = [
                keras2_format.WEIGHTS_PREFIX + ".*",
                keras2_format.MODEL_CONFIG_FILENAME,
            ]
        with ckpt.restore_path(checkpoint_uuid, selector=selector) as path:
            staging = tempfile.mkdtemp(prefix=f"ckptstore-export-{checkpoint_uuid[:8]}-")
            try:
                out = os.path.join(staging, SAVED_MODEL_DIRNAME)
                if keras2:
                    result = _export_keras2_checkpoint(
                        path,
                        out,
                        verify=verify,
                        safe_mode=safe_mode,
                        custom_objects=custom_objects,
                    )
                else:
                    model_path = os.path.join(path, MODEL_FILENAME)
                    result = export_model_file(
                        model_path,
                        out,
                        modules=_archive_modules(model_path),
                        verify=verify,
                        safe_mode=safe_mode,
                        custom_objects=custom_objects,
                    )
                amend.add_files(
                    ckpt.storage,
                    checkpoint_uuid,
                    staging,
                    index=ckpt.index,
                    storage_url=ckpt.storage_url,
                )
            finally:
                import shutil

                shutil.rmtree(staging, ignore_errors=True)
    result.path = f"{ckpt.storage_url.rstrip('/')}/{checkpoint_uuid}/{SAVED_MODEL_DIRNAME}"
    logger.info("Added a SavedModel to checkpoint %s in %.1f s", checkpoint_uuid, result.seconds)
    return result


def _keras2_here() -> bool:
    """Whether ``tf.keras`` is (or, TensorFlow's Keras not chosen yet, will be) Keras 2 in this
    process — :func:`ckptstore.keras_io.backend.legacy_keras_requested` without importing a
    Keras."""
    backend = sys.modules.get("ckptstore.keras_io.backend")
    if backend is not None:
        return bool(backend.IS_KERAS2)
    tf = sys.modules.get("tensorflow")
    loader = getattr(tf, "__dict__", {}).get("keras") if tf is not None else None
    if loader is not None and getattr(loader, "_tfll_initialized", False):
        return getattr(loader, "_tfll_keras_version", None) == "tf_keras"
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")


def _export_keras2_checkpoint(
    path: str,
    out: str,
    *,
    verify: bool,
    safe_mode: bool,
    custom_objects: Mapping[str, Any] | None,
) -> ExportResult:
    """Export a downloaded Keras 2 checkpoint folder: in this process when it runs Keras 2,
    else in a Keras 2 :class:`ExportWorker` (a Keras 3 process cannot rebuild tf_keras
    models; nor does the ``ckptstore`` command import TensorFlow)."""
    from ckptstore.keras_io import keras2_format

    with open(os.path.join(path, keras2_format.MODEL_CONFIG_FILENAME), encoding="utf-8") as f:
        config_json = f.read()
    if _keras2_subclassed(config_json):
        raise errors.ModelLoadError(_SUBCLASSED_HINT.format(what=f"Keras 2 checkpoint {path}"))
    modules = custom_modules(config_json)
    if _keras2_here():
        return export_keras2_folder(
            path,
            out,
            verify=verify,
            modules=modules,
            safe_mode=safe_mode,
            custom_objects=custom_objects,
        )
    if custom_objects:
        raise errors.ExportError(
            "custom_objects cannot be handed to the Keras 2 process that exports a Keras 2 "
            "checkpoint from this Keras 3 process: call export_checkpoint() in a process with "
            "TF_USE_LEGACY_KERAS=1, or make the custom layers' modules importable (PYTHONPATH) "
            "and registered (tf.keras.saving.register_keras_serializable)."
        )
    worker = ExportWorker(nice=0, keras2=True)
    try:
        return worker.export_keras2(path, out, modules=modules, verify=verify, safe_mode=safe_mode)
    finally:
        worker.close()


def _archive_modules(model_path: str) -> list[str]:
    """The custom-layer modules named in a ``.keras`` file's ``config.json``."""
    import zipfile

    try:
        with zipfile.ZipFile(model_path) as archive:
            return custom_modules(archive.read("config.json").decode())
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise errors.ExportError(
            f"{model_path} is not a readable .keras file ({exc}); the checkpoint is damaged or "
            "was not written by Keras 3."
        ) from exc


@contextlib.contextmanager
def _checkpoint_context(
    uuid: str, storage: StorageSpec | None, registry: Registry
) -> Iterator[Any]:
    """A CheckpointContext on the storage holding ``uuid``, indexed by the registry."""
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.keras_io.loaders import resolve_checkpoint, storage_opener
    from ckptstore.registry import Registry, open_registry

    opened: list[Any] = []
    storage_for = storage_opener(storage, opened)

    owns_registry = not isinstance(registry, Registry)
    reg = open_registry(registry)
    try:
        found, url = resolve_checkpoint(reg, storage_for, None, uuid)
        store = storage_for(url)
        ckpt = CheckpointContext(store, index=reg, storage_url=url or store.url)
        try:
            yield ckpt
        finally:
            ckpt.close()
    finally:
        for s in opened:
            with contextlib.suppress(Exception):
                s.close()
        if owns_registry:
            with contextlib.suppress(Exception):
                reg.close()


def _checkpoint_main(args: Any) -> int:
    """``python -m ckptstore.keras_io.export checkpoint UUID``: what ``ckptstore checkpoint
    export`` runs (the command itself never imports TensorFlow). Prints one JSON line: the
    result, or ``{"error": class name, "message": ...}`` with exit code 1."""
    try:
        result = export_checkpoint(
            args.uuid,
            storage=args.storage,
            registry=args.registry,
            verify=not args.no_verify,
            safe_mode=not args.unsafe_deserialization,
        )
    except errors.CkptstoreError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    print(json.dumps(result.to_json()), flush=True)
    return 0


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="ckptstore's SavedModel exports")
    parser.add_argument("--worker", action="store_true", help="serve ExportWorker requests")
    parser.add_argument("--nice", type=int, default=5)
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("checkpoint", help="add saved_model/ to a committed checkpoint")
    one.add_argument("uuid")
    one.add_argument("--storage")
    one.add_argument("--registry")
    one.add_argument("--no-verify", action="store_true")
    one.add_argument("--unsafe-deserialization", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "checkpoint":
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        return _checkpoint_main(args)
    if not args.worker:
        parser.error("pass --worker or the 'checkpoint' command")
    return _worker_main(args.nice)


if __name__ == "__main__":
    sys.exit(_main())
