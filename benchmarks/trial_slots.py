"""A TFKerasTrial on 2 slots against 1 in the same run (the local runner).

The trial is a ``model_def:CIFARTrial`` in the shape of Determined's cifar10_tf_keras example (a
small conv net on 32x32x3 images, 10 classes; random NumPy data, nothing downloaded) with
``resources.slots_per_trial: 1`` and ``2``: with 2, Determined's TensorFlow launcher starts two
worker processes on this machine under MultiWorkerMirroredStrategy, each training on its half
of every global batch, and the chief writes each checkpoint. The same global batch size both
times; a checkpoint every ``--steps`` batches (``min_checkpoint_period``). The chief measures,
with a Keras callback the trial returns from ``keras_callbacks()``:

- time per batch: the median time between two ``on_train_batch_end`` inside a workload;
- checkpoint stall: the median time from the last batch of a workload to the first batch of
  the next, when the controller reports metrics and writes the checkpoint in between.

Prints each figure and the ratio 2 slots / 1 slot. On a shared 2-core machine the two workers
share the cores with everything else: read the figures as rough.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/trial_slots.py --checkpoints 4 --steps 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _slots import print_ratios, run_bench  # benchmarks/, the script's folder

REPO = Path(__file__).resolve().parents[1]

MODEL_DEF = """
import json, statistics, time
import numpy as np
import tensorflow as tf
from determined import keras


class Clock(tf.keras.callbacks.Callback):
    def __init__(self, context):
        super().__init__()
        self.context, self.ends, self.begins = context, [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def on_train_end(self, logs=None):
        if self.context.distributed.get_rank() != 0:
            return
        steps = self.context.get_hparam("steps")
        gaps = [b - a for i, (a, b) in enumerate(zip(self.ends, self.ends[1:])) if (i + 1) % steps]
        stalls = [self.begins[i] - self.ends[i - 1] for i in range(steps, len(self.begins), steps)]
        print("BENCH " + json.dumps({
            "batch": statistics.median(gaps[steps:] or gaps),
            "stall": statistics.median(stalls[1:] or stalls),
            "size": self.context.distributed.get_size(),
        }), flush=True)


class CIFARTrial(keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        layers = tf.keras.layers
        model = self.context.wrap_model(tf.keras.Sequential([
            layers.Input((32, 32, 3)),
            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Flatten(), layers.Dense(64, activation="relu"), layers.Dense(10),
        ]))
        optimizer = self.context.wrap_optimizer(tf.keras.optimizers.Adam(1e-3))
        model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def keras_callbacks(self):
        return [Clock(self.context)]

    def _data(self, n, seed):
        rng = np.random.RandomState(seed)
        return rng.rand(n, 32, 32, 3).astype("float32"), rng.randint(0, 10, size=n)

    def build_training_data_loader(self):
        return self._data(self.context.get_hparam("steps") * self.context.get_global_batch_size(), 0)

    def build_validation_data_loader(self):
        return self._data(self.context.get_global_batch_size(), 1)
"""


def _run(base: Path, slots: int, args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(dir=base))
    (work / "model_def.py").write_text(MODEL_DEF)
    config = {
        "name": f"cifar-trial-{slots}-slots",
        "hyperparameters": {"global_batch_size": args.batch, "steps": args.steps},
        "resources": {"slots_per_trial": slots},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": args.steps * args.checkpoints},
        },
        "min_checkpoint_period": {"batches": args.steps},
        "scheduling_unit": args.steps,
        "entrypoint": "model_def:CIFARTrial",
    }
    (work / "exp.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    env["CKPTSTORE_HOME"] = str(work / "home")
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", str(work / "ckpts")]
    cmd += ["--registry", f"sqlite:///{work / 'reg.db'}", "experiment", "create", "exp.yaml", "."]
    return run_bench(cmd, work, env, slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=4, help="workloads, one checkpoint each")
    parser.add_argument("--steps", type=int, default=20, help="batches per workload")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="ckts", dir="/tmp"))
    figures: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    try:
        for repeat in range(args.repeats):
            for slots in (1, 2):
                figures[slots].append(_run(base, slots, args))
                print(f"repeat {repeat + 1}, {slots} slot(s): {figures[slots][-1]}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_ratios(figures)


if __name__ == "__main__":
    main()
