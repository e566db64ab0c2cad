"""The Ray engine's costs, each against the local runner measured in the same run:

1. ``create -> first step``: seconds from starting ``ckptstore experiment create`` (the
   TFKerasTrial example, one trial, a report after every batch) until the registry holds the
   trial's first training metrics; ``--engine local`` vs ``--engine ray`` on a one-node Ray
   cluster started beforehand on 127.0.0.2 (its start-up is not counted).
2. ``per checkpoint``: median seconds of one ``core_context.checkpoint.store_path`` save of a
   small Keras model (``model.save`` + commit + registry row), in a process of its own vs inside
   a Ray Train worker (``TensorflowTrainer``, one worker) on the same cluster.

Prints each figure and the ratio Ray / local. Runs ``--repeats`` times (median), interleaved.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/ray_engine.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from ckptstore.registry import Registry  # noqa: E402
from tests._helpers.ports import free_port  # noqa: E402
from tests.servers import ray_cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "mnist_tfkeras_trial"


def _first_step_seconds(work: Path, engine: str, address: str) -> float:
    raw = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    raw["searcher"].pop("max_steps", None)
    raw["searcher"]["max_length"] = {"batches": 2}
    raw.update(scheduling_unit=1, min_validation_period={"batches": 2})
    raw.pop("checkpoint_storage", None)
    cfg = work / "const.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    registry = f"sqlite:///{work / 'reg.db'}"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    env["CKPTSTORE_HOME"] = str(work / "home")
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", str(work / "ckpts")]
    cmd += ["--registry", registry, "experiment", "create", str(cfg), str(EXAMPLE)]
    if engine == "ray":
        cmd += ["--engine", "ray", "--address", address]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() not in (None, 0):
                raise RuntimeError(f"{engine} run failed with {proc.returncode}")
            if (work / "reg.db").exists():
                with Registry(registry) as reg:
                    if any(reg.get_metrics(t.id, "training") for t in reg.list_trials()):
                        return time.perf_counter() - start
            time.sleep(0.05)
    finally:
        proc.wait(timeout=600)


def checkpoint_seconds(storage: str, saves: int) -> float:
    """Median seconds per ``store_path`` save of a small Keras model (runs where it is called)."""
    import keras

    import ckptstore

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss="mse")
    times = []
    registry = f"sqlite:///{storage}/reg.db"
    with ckptstore.core.init(storage=storage, registry=registry, trial_id=1) as core:
        for step in range(saves):
            start = time.perf_counter()
            with core.checkpoint.store_path({"steps_completed": step + 1}) as (path, _):
                model.save(os.path.join(path, "model.keras"))
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:] or times)  # the first save pays for imports


def _train_worker(config: dict) -> None:
    # Handed back through a file: Ray Train 2.5x's Result.metrics is None when the worker
    # reports no checkpoint, and the worker runs on this machine (one-node cluster).
    seconds = checkpoint_seconds(config["storage"], config["saves"])
    Path(config["storage"], "seconds.txt").write_text(repr(seconds))


def _ray_checkpoint_seconds(address: str, storage: str, saves: int) -> float:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    TensorflowTrainer(
        _train_worker,
        train_loop_config={"storage": storage, "saves": saves},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(Path(storage) / "ray_results")),
    ).fit()
    return float(Path(storage, "seconds.txt").read_text())


def _local_checkpoint_seconds(storage: str, saves: int) -> float:
    here = str(Path(__file__).parent)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import ray_engine as b; "
        f"print(b.checkpoint_seconds({storage!r}, {saves}))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--saves", type=int, default=6)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="ckb", dir="/tmp"))
    os.environ.update(ray_cluster.CLUSTER_ENV)  # this driver and every process it starts
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0")
    port = free_port(ray_cluster.HEAD_IP)
    address = f"{ray_cluster.HEAD_IP}:{port}"
    ray_cluster._ray_start(
        ["--head", "--node-ip-address", ray_cluster.HEAD_IP, "--port", str(port)]
        + ["--include-dashboard", "false"],
        str(base / "h"),
        env,
    )
    figures: dict[str, list[float]] = {}
    try:
        for repeat in range(args.repeats):
            for engine in ("local", "ray"):
                work = Path(tempfile.mkdtemp(dir=base))
                figures.setdefault(f"first step {engine}", []).append(
                    _first_step_seconds(work, engine, address)
                )
            for where in ("local", "ray"):
                storage = tempfile.mkdtemp(dir=base)
                measure = _local_checkpoint_seconds if where == "local" else None
                seconds = (
                    measure(storage, args.saves)
                    if measure
                    else _ray_checkpoint_seconds(address, storage, args.saves)
                )
                figures.setdefault(f"checkpoint {where}", []).append(seconds)
            print(
                f"repeat {repeat + 1}: "
                + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in figures.items())
            )
    finally:
        for _ in range(3):
            ray_cluster._kill(ray_cluster._tree(str(base)))
            time.sleep(0.5)
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"{'measure':<28}{'local s':>10}{'ray s':>10}{'ray/local':>11}")
    for name in ("first step", "checkpoint"):
        local, ray_ = med[f"{name} local"], med[f"{name} ray"]
        label = "create -> first step" if name == "first step" else "per checkpoint (store_path)"
        print(f"{label:<28}{local:>10.3f}{ray_:>10.3f}{ray_ / local:>10.2f}x")


if __name__ == "__main__":
    main()
