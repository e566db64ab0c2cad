"""A multi-worker trial on the Ray engine, 2 slots against 1 in the same run.

The trial is a script in the shape of Determined's CIFAR-10 example (a small conv net on
32x32x3 images, 10 classes; random data, nothing downloaded) launched the Determined way
(``python3 -m determined.launch.tensorflow -- python3 train.py``) with
``resources.slots_per_trial: 1`` and ``2`` on a two-node loopback Ray cluster (one CPU per
node; its start-up is not counted): with 2 slots, two Ray Train workers under
MultiWorkerMirroredStrategy, the chief writing each checkpoint. The same global batch size
both times. The chief measures, with Keras callbacks around ``DeterminedCallback``:

- time per batch: the median time between two ``on_train_batch_end`` of an epoch;
- checkpoint stall: the median time ``DeterminedCallback.on_epoch_end`` (which checkpoints
  every epoch) keeps ``fit()`` waiting.

Prints each figure and the ratio 2 slots / 1 slot. On a shared 2-core machine the two workers
share the cores with everything else: read the figures as rough.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/ray_slots.py --epochs 3 --steps 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402
from _slots import print_ratios, run_bench  # noqa: E402  (benchmarks/, the script's folder)

from tests._helpers.ports import free_port  # noqa: E402
from tests.servers import ray_cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

TRAIN_PY = """
import json, statistics, sys, time
import determined as det
import determined.keras
import numpy as np
from tensorflow.keras import callbacks, layers, models

EPOCHS, STEPS, GLOBAL_BATCH = (int(a) for a in sys.argv[1:4])


class Clock(callbacks.Callback):
    def __init__(self, marks, name):
        super().__init__()
        self.marks, self.name = marks, name

    def on_train_batch_end(self, batch, logs=None):
        if self.name == "before":
            self.marks.setdefault("batches", []).append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        self.marks.setdefault(self.name, []).append(time.perf_counter())


def main(core_context, strategy):
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS * GLOBAL_BATCH, 32, 32, 3).astype("float32")
    y = rng.randint(0, 10, size=STEPS * GLOBAL_BATCH)
    with strategy.scope():
        model = models.Sequential([
            layers.Input((32, 32, 3)),
            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Flatten(), layers.Dense(64, activation="relu"), layers.Dense(10),
        ])
        model.compile("adam", "sparse_categorical_crossentropy")
    marks = {}
    det_cb = det.keras.DeterminedCallback(
        core_context, checkpoint=None, continue_id=1, checkpoint_epochs=1
    )
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, verbose=0,
              callbacks=[Clock(marks, "before"), det_cb, Clock(marks, "after")])
    if core_context.distributed.rank == 0:
        ticks = marks["batches"]
        gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b - a > 0]
        per_epoch = [gaps[i * (STEPS - 1):(i + 1) * (STEPS - 1)] for i in range(EPOCHS)]
        batch = statistics.median([g for e in per_epoch[1:] for g in e] or gaps)
        stall = [a - b for a, b in zip(marks["after"], marks["before"])]
        print("BENCH " + json.dumps({"batch": batch, "stall": statistics.median(stall[1:] or stall),
                                     "size": core_context.distributed.size}), flush=True)


distributed, strategy = det.core.DistributedContext.from_tf_config()
with det.core.init(distributed=distributed) as core_context:
    main(core_context, strategy)
"""


def _run(base: Path, address: str, slots: int, args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(dir=base))
    (work / "train.py").write_text(TRAIN_PY)
    config = {
        "name": f"cifar-shaped-{slots}-slots",
        "hyperparameters": {"global_batch_size": args.batch},
        "resources": {"slots_per_trial": slots},
        "searcher": {"name": "single", "metric": "loss"},
        "entrypoint": "python3 -m determined.launch.tensorflow -- python3 train.py "
        f"{args.epochs} {args.steps} {args.batch}",
    }
    (work / "exp.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", RAY_DEDUP_LOGS="0")
    env["CKPTSTORE_HOME"] = str(work / "home")
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", str(work / "ckpts")]
    cmd += ["--registry", f"sqlite:///{work / 'reg.db'}", "experiment", "create", "exp.yaml", "."]
    cmd += ["--engine", "ray", "--address", address]
    return run_bench(cmd, work, env, slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="ckb", dir="/tmp"))
    os.environ.update(ray_cluster.CLUSTER_ENV)  # this driver and every process it starts
    port = free_port(ray_cluster.HEAD_IP)
    cluster = ray_cluster.RayCluster(f"{ray_cluster.HEAD_IP}:{port}", base, ray_cluster.node_env())
    figures: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    try:
        ray_cluster._ray_start(
            ["--head", "--node-ip-address", ray_cluster.HEAD_IP, "--port", str(port)]
            + ["--include-dashboard", "false"],
            cluster.node_dir("h"),
            cluster.env,
        )
        cluster.start_node("w", ray_cluster.NODE_IP)
        for repeat in range(args.repeats):
            for slots in (1, 2):
                figures[slots].append(_run(base, cluster.address, slots, args))
                print(f"repeat {repeat + 1}, {slots} slot(s): {figures[slots][-1]}", flush=True)
    finally:
        for _ in range(3):
            ray_cluster._kill(ray_cluster._tree(str(base)))
            time.sleep(0.5)
        shutil.rmtree(base, ignore_errors=True)
    print_ratios(figures)


if __name__ == "__main__":
    main()
