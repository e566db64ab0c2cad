"""The export worker: a separate Python process that runs :mod:`._savedmodel` exports on request,
over JSON lines on its stdin/stdout (:class:`ExportWorker` is the parent's side,
:func:`worker_main` the child's).

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from typing import Any

from ckptstore import errors
from ckptstore.keras_io.exporting._savedmodel import (
    ExportResult,
    export_keras2_folder,
    export_model_file,
)

logger = logging.getLogger(__name__)


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
            if env["KERAS_BACKEND"] == "torch":
                # Keras exports a SavedModel from PyTorch through torch.export, which rejects
                # plain Keras models' input structures; the .keras archive is the same on every
                # backend, so the worker exports it on TensorFlow, Keras's native path.
                env["KERAS_BACKEND"] = "tensorflow"
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
                "ckptstore.keras_io.exporting",
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
            if answer.get("type") == errors.UntrustedCode.__name__:
                raise errors.UntrustedCode(str(answer.get("error")))
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


def worker_main(nice: int) -> int:
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
        except errors.UntrustedCode as exc:  # kept typed: a refusal, not a failed export
            answer = {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except errors.ExportError as exc:
            answer = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            answer = {"ok": False, "error": f"Export failed: {type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(answer) + "\n")
    return 0
