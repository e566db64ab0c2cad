"""Training scripts in the shapes keras-io writes for JAX and PyTorch, run as a user runs them
(``python tests/keras_io/backend_shapes_worker.py``). No tests in here;
``tests/keras_io/test_backend_shapes.py`` runs it in the JAX and PyTorch child runs.

The scripts live in one module per family, each with its own ``SHAPES`` (name -> builder, the
backends it runs on): ``backend_shapes_worker_steps.py`` (a ``train_step`` of the backend's own
style, ``keras.distribution``'s ``DataParallel`` and ``ModelParallel``, a GAN with its own
``SeedGenerator``, gradient accumulation, ``steps_per_execution``), ``_data.py`` (tf.data
pipelines, TextVectorization, a PyDataset, a generator), ``_script.py`` (augmentation layers,
objects of the script, Keras's stateful callbacks) and ``_agnostic.py`` (a ``keras.ops`` layer
built lazily, integer sequences, a VAE, mixed precision, ``jit_compile=False``); what they
share is in ``_base.py``. Their classes live in those modules, imported by this script (the
``__main__`` case, a class of the training script itself, is test_backend_coverage.py's).

    KERAS_BACKEND=jax python tests/keras_io/backend_shapes_worker.py --dir D --phase first|final

Each phase runs every shape of this process's backend in turn (each with its own storage,
registry and seed, built in the same order in every phase, so layer names agree): ``first``
trains each shape 2 epochs of 4 steps with ``DeterminedCallback`` (``straight``), then again
sending itself a real SIGTERM after step ``SIGTERM_AT`` (a shape's own ``sigterm_at``: batch-end
calls) inside epoch 2 (``part``); ``final`` (a new process, as after a preemption) resumes from
the latest checkpoint, finishes, loads the last checkpoint by UUID and compares its predictions
with the trained model's. Writes
``D/<phase>.json`` (per shape: steps, resumed, last epoch's logs, load result, errors) and
``D/<phase>-<shape>.npz`` (model and optimizer variables, by position).

The distributed shapes need two JAX devices: the test starts this script with
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (two host CPU devices).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402
from tests.keras_io import backend_shapes_worker_agnostic as agnostic  # noqa: E402
from tests.keras_io import backend_shapes_worker_data as data  # noqa: E402
from tests.keras_io import backend_shapes_worker_script as script  # noqa: E402
from tests.keras_io import backend_shapes_worker_steps as steps  # noqa: E402
from tests.keras_io.backend_shapes_worker_base import (  # noqa: E402
    BACKEND,
    BATCH,
    BATCH_SPECS,
    Shape,
)

#: shape -> (its builder, the backends it runs on), family by family
SHAPES = {**steps.SHAPES, **script.SHAPES, **data.SHAPES, **agnostic.SHAPES}


def shapes_here() -> list[str]:
    return [name for name, (_fn, backends) in SHAPES.items() if BACKEND in backends]


class Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process right after batch ``step`` of this run; records the epochs'
    logs, and where the first kernel lives when epoch 2 begins (after the epoch-1 checkpoint
    gave the variables copies, or after a resume loaded them)."""

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.step, self.steps_here, self.epoch_logs = step, 0, []
        self.epoch, self.epoch2_layout = 0, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and self.epoch2_layout is None:
            self.epoch2_layout = _layout(self.model.trainable_variables[0])

    def on_train_batch_end(self, batch, logs=None):
        self.steps_here += 1
        if self.step is not None and self.steps_here == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append({k: float(v) for k, v in (logs or {}).items()})


def run_shape(name: str, phase: str, root: str) -> dict[str, Any]:
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    tag = "-straight" if phase == "straight" else ""
    storage = os.path.join(folder, "ckpts" + tag)
    registry = f"sqlite:///{os.path.join(folder, f'registry{tag}.db')}"
    keras.backend.clear_session()  # the same layer (and RNG state) names in every process
    keras.utils.set_random_seed(3)
    shape = SHAPES[name][0]()
    model = shape.model
    sigterm = Sigterm(shape.sigterm_at if phase == "part" else None)
    out: dict[str, Any] = {"shape": name}
    with shape.scope(), det.core.init(storage=storage, registry=registry, trial_id=1) as core:
        cb = det.keras.DeterminedCallback(
            core, core.info.latest_checkpoint, continue_id=1, export_saved_model="never"
        )
        callbacks = [sigterm, *shape.callbacks(folder), cb]
        model.fit(*shape.data, epochs=shape.epochs, verbose=0, callbacks=callbacks, **shape.fit)
        out.update(preempted=bool(core.preempt.acknowledged), resumed=cb.resumed)
        out.update(steps_here=sigterm.steps_here, logs=sigterm.epoch_logs[-1:])
        # a GAN steps its own optimizers (its compiled one never steps)
        optimizers = [
            getattr(model, k) for k in ("d_optimizer", "g_optimizer") if hasattr(model, k)
        ]
        optimizers = optimizers or [model.optimizer]
        out["iterations"] = [int(keras.ops.convert_to_numpy(o.iterations)) for o in optimizers]
        out["layout"] = _layout(model.trainable_variables[0])
        out["optimizer"] = type(optimizers[0]).__name__
        out["learning_rate"] = float(keras.ops.convert_to_numpy(optimizers[0].learning_rate))
        out["epoch2_layout"] = sigterm.epoch2_layout
        out["batch_specs"] = sorted(set(BATCH_SPECS))
        BATCH_SPECS.clear()
        arrays = {f"model/{i:03d}": _numpy(v) for i, v in enumerate(model.variables)}
        slots = [v for o in optimizers for v in o.variables]
        arrays.update({f"opt/{i:03d}": _numpy(v) for i, v in enumerate(slots)})
        np.savez(os.path.join(root, f"{phase}-{name}.npz"), **arrays)
        if phase == "final":
            out["load"] = _load(model, shape, cb.last_checkpoint, storage, registry)
    if phase == "final" and shape.scope is not contextlib.nullcontext:
        # the same checkpoint on one device (no distribution): the same predictions
        got = _load(model, shape, cb.last_checkpoint, storage, registry)
        out["load_on_one_device"] = got
    return out


def _load(model: Any, shape: Shape, uuid: str, storage: str, registry: str) -> dict[str, Any]:
    """Loads checkpoint ``uuid`` by UUID: its layout, and how its predictions compare."""
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=storage, registry=registry, **shape.load
    )
    want, got = (m.predict(shape.sample, batch_size=BATCH, verbose=0) for m in (model, loaded))
    return {
        "predict_equal": bool(np.array_equal(want, got)),
        "max_diff": float(np.max(np.abs(want - got))),
        "layout": _layout(loaded.trainable_variables[0]),
    }


def _numpy(variable: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable.value))


def _layout(variable: Any) -> str:
    """Where ``variable``'s value lives: on one device, replicated or sharded on N (JAX)."""
    sharding = getattr(variable.value, "sharding", None)
    if sharding is None or len(sharding.device_set) == 1:
        return "one device"
    how = "replicated" if sharding.is_fully_replicated else "sharded"
    return f"{how} on {len(sharding.device_set)}"


def recorded(name: str, phase: str, root: str) -> dict[str, Any]:
    """:func:`run_shape`'s results with its CPU seconds, or the error it raised."""
    started = time.process_time()
    try:
        return {**run_shape(name, phase, root), "cpu_s": time.process_time() - started}
    except Exception as exc:  # noqa: BLE001 - recorded per shape; the test reports it
        traceback.print_exc()
        return {"shape": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--phase", choices=("first", "final"), required=True)
    p.add_argument("--shapes", default=None, help="comma-separated (default: this backend's)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    names = args.shapes.split(",") if args.shapes else shapes_here()
    # first: each shape straight, then preempted; final (a new process): each one resumed
    for phase in ("straight", "part") if args.phase == "first" else ("final",):
        out = {name: recorded(name, phase, args.dir) for name in names}
        with open(os.path.join(args.dir, f"{phase}.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
