"""How ``shape_corpus_worker.py`` runs its shapes (the script itself holds only the shapes, as a
training script of the user's would: its classes live in ``__main__``).

Each phase runs every shape in turn in one process (each with its own storage, registry and
seed; the shapes are built in the same order in every phase, so layer names agree):
``straight`` trains 2 epochs of 4 steps with ``DeterminedCallback``; ``part`` does the same and
sends itself SIGTERM after step ``SIGTERM_AT`` (inside epoch 2); ``final`` resumes from the
latest checkpoint, finishes, loads the last checkpoint by UUID and compares its predictions.
Writes ``D/<phase>.json`` (per shape: steps, resumed, missing artifacts, load result, errors)
and ``D/<phase>-<shape>.npz`` (model and optimizer variables).
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
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import ckptstore as det
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras, optimizer_variables

BATCH = 4
STEPS = 4  # per epoch
EPOCHS = 2
N = BATCH * STEPS
SIGTERM_AT = 6  # inside epoch 2
#: The phase whose shape is being built (``straight``, ``part``, ``final``): a shape whose
#: callbacks write files (``user_callbacks``) gives the uninterrupted run its own folder.
PHASE = ""


class Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process right after batch ``step`` of this run (first in the list)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.steps_here, self.begin = step, 0, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self.steps_here += batch - self.begin + 1  # steps_per_execution=k: k batches a call
        if self.step is not None and self.steps_here == self.step:  # the part run starts at 0
            os.kill(os.getpid(), signal.SIGTERM)


def run_shape(corpus: ModuleType, name: str, phase: str, root: str) -> dict:
    cpu = time.process_time()
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    storage = os.path.join(folder, "ckpts")
    registry = f"sqlite:///{os.path.join(folder, 'registry.db')}"
    if phase == "straight":
        storage += "-straight"
        registry = registry.replace("registry.db", "straight.db")
    keras.backend.clear_session()  # the same layer (and RNG state) names in every process
    if KERAS_MAJOR == 2:
        keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(3)
    global PHASE
    PHASE = phase
    model, args, kwargs, sample, load = corpus.SHAPES[name]()
    kwargs = dict(kwargs)
    extra_callbacks = kwargs.pop("callbacks", [])
    epochs = kwargs.pop("epochs", EPOCHS)  # with a user-set initial_epoch: 2 epochs still
    step = None
    if phase == "part":
        step = STEPS if name in corpus.SIGTERM_AT_EPOCH_END else SIGTERM_AT
    sigterm = Sigterm(step)
    out: dict = {"shape": name}
    with det.core.init(storage=storage, registry=registry, trial_id=1) as core:
        # the export (worker process or in-process) is part of the resumed run's final save
        export = "final" if phase == "final" and name in corpus.EXPORT_SHAPES else "never"
        cb = det.keras.DeterminedCallback(
            core, core.info.latest_checkpoint, continue_id=1, export_saved_model=export
        )
        model.fit(
            *args,
            epochs=epochs,
            verbose=0,
            callbacks=[sigterm, *extra_callbacks, cb],
            **_batch(args, kwargs),
        )
        out.update(preempted=bool(core.preempt.acknowledged), resumed=cb.resumed)
    last = cb.last_checkpoint
    optimizers = _optimizers(model)
    iterations = sum(int(o.iterations.numpy()) for o in optimizers)  # all the model stepped
    out.update(steps_here=sigterm.steps_here, iterations=iterations)
    out["jit_compile"] = bool(getattr(model, "jit_compile", False))  # XLA ran the train step
    # by position: the straight and preempted runs share a process, so layer names differ
    variables = [v for v in model.variables if hasattr(v, "numpy")]  # not Keras 2's handlers
    arrays = {f"model/{i:03d}": v.numpy() for i, v in enumerate(variables)}
    opt = optimizer_variables(model)
    for extra in optimizers[1:]:
        found = extra.variables
        opt = opt + list(found() if callable(found) else found)
    arrays.update({f"opt/{i:03d}": v.numpy() for i, v in enumerate(opt)})
    arrays.update(_loss_scale(model.optimizer))
    # a stateful RNN's carried states (in neither Keras's variables list): the state fit() left
    stateful = [layer for layer in model.layers if getattr(layer, "stateful", False)]
    for i, layer in enumerate(stateful):
        arrays.update({f"state/{i}-{j}": np.asarray(s) for j, s in enumerate(layer.states)})
    np.savez(os.path.join(root, f"{phase}-{name}.npz"), **arrays)
    meta = {}
    if last:
        with open(os.path.join(storage, last, "metadata.json")) as f:
            meta = json.load(f)
    out.update(missing=meta.get("missing", {}), saved_model=meta.get("saved_model"))
    if phase == "final":
        out["load"] = _load_and_compare(model, last, storage, registry, sample, load)
    out["cpu_seconds"] = round(time.process_time() - cpu, 2)  # what a shape costs CI
    return out


def _optimizers(model: Any) -> list[Any]:
    """``model.optimizer``, then the optimizers a model's own ``compile()`` kept in its public
    attributes (a GAN's two, SimCLR's contrastive and probe ones), by attribute name."""
    own = [
        value
        for key, value in sorted(vars(model).items())
        if not key.startswith("_") and key != "optimizer" and hasattr(value, "apply_gradients")
    ]
    return [model.optimizer, *(o for o in own if o is not model.optimizer)]


def _loss_scale(optimizer: Any) -> dict[str, Any]:
    """Keras 2's dynamic loss scale and its good-step counter, which its
    ``LossScaleOptimizer.variables()`` leaves out (Keras 3's lists them)."""
    counter = getattr(optimizer, "dynamic_counter", None) if KERAS_MAJOR == 2 else None
    if counter is None:
        return {}
    return {"opt/loss_scale": np.asarray(optimizer.loss_scale), "opt/counter": counter.numpy()}


def _batch(args, kwargs):
    """``batch_size`` for array inputs (a dataset or generator batches itself)."""
    if isinstance(args[0], (np.ndarray, dict, list, tuple)):
        return {"batch_size": BATCH, **kwargs}
    return kwargs


@contextlib.contextmanager
def without_op_determinism() -> Iterator[None]:
    """TensorFlow's op determinism off inside (on again after, when it was on): Keras 3 turns a
    model's ``jit_compile=True`` off when it compiles one under it."""
    was_on = tf_config.is_op_determinism_enabled()
    tf_config.disable_op_determinism()
    try:
        yield
    finally:
        if was_on:
            tf_config.enable_op_determinism()


def _load_and_compare(model, uuid, storage, registry, sample, load) -> dict:
    """Load checkpoint ``uuid`` by UUID (as the shape says) and compare predictions (with the
    shape's ``predict`` when the model has no ``call``; without op determinism, where a
    ``jit_compile=True`` model predicts with XLA, when the shape says ``op_determinism=False``)."""
    load = dict(load)
    if not load.pop("op_determinism", True):
        with without_op_determinism():
            return _load_and_compare(model, uuid, storage, registry, sample, load)
    predict = load.pop("predict", _predict)
    if isinstance(sample, dict):  # string arrays go in as a dataset (Keras 3 refuses '<U5')
        sample = tf.data.Dataset.from_tensor_slices(sample).batch(BATCH)
    want = predict(model, sample)
    result: dict = {}
    if "model" in load:  # weights-only: say so without model=, load with it
        without = {k: v for k, v in load.items() if k != "model"}
        try:
            plain = det.load_checkpoint_model(
                checkpoint_uuid=uuid, storage=storage, registry=registry, **without
            )
        except Exception as exc:  # noqa: BLE001 - the cell says what happened
            result["without_model"] = (
                "ModelLoadError names model=" if "model=" in str(exc) else str(exc)
            )
        else:  # (Keras 2 revives a model without config from its SavedModel)
            same = np.array_equal(want, predict(plain, sample))
            result["without_model"] = "loaded, " + ("same" if same else "other") + " predictions"
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=storage, registry=registry, **load
    )
    result["predict_equal"] = bool(np.array_equal(want, predict(loaded, sample)))
    return result


def _predict(model, sample):
    """Predictions from a fresh state: a stateful RNN starts from zero states."""
    for layer in model.layers:
        if getattr(layer, "stateful", False):
            layer.reset_states() if hasattr(layer, "reset_states") else layer.reset_state()
    batch = None if isinstance(sample, tf.data.Dataset) else BATCH
    return np.asarray(model.predict(sample, batch_size=batch, verbose=0))


def main(corpus: ModuleType, argv=None) -> int:
    """Run the phase ``--phase`` of ``corpus``'s shapes (``SHAPES``, ``EXPORT_SHAPES``,
    ``SIGTERM_AT_EPOCH_END``, ``KERAS3_ONLY``) in this process, in ``--dir``."""
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--phase", choices=("first", "final"), required=True)
    p.add_argument("--shapes", default=",".join(corpus.SHAPES))
    args = p.parse_args(argv)
    root = os.path.abspath(args.dir)
    os.chdir(root)  # shapes that write data files write them here
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tf.config.experimental.enable_op_determinism()
    # first: the straight run and the preempted one of each shape; final (a new process, as
    # after a real preemption): the resumed run, the load by UUID
    phases = ("straight", "part") if args.phase == "first" else ("final",)
    for phase in phases:
        results = {}
        for name in args.shapes.split(","):
            if KERAS_MAJOR == 2 and name in corpus.KERAS3_ONLY:
                results[name] = {"shape": name, "keras3_only": corpus.KERAS3_ONLY[name]}
                continue
            try:
                results[name] = run_shape(corpus, name, phase, root)
            except Exception as exc:  # noqa: BLE001 - recorded per shape; the test reports it
                traceback.print_exc()
                results[name] = {"shape": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        with open(os.path.join(root, f"{phase}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0
