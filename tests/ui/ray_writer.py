"""A Ray run for the UI's live test: one Ray task (in a Ray worker process of a local
single-node cluster on 127.0.0.2) reports metrics and commits a checkpoint every step through
``ckptstore.core``, into trial ``argv[1]`` of registry ``argv[2]`` / storage ``argv[3]``,
pausing ``argv[5]`` seconds between ``argv[4]`` steps. Prints the worker's pid.

Run: ``python -m tests.ui.ray_writer TRIAL REGISTRY STORAGE STEPS PAUSE``
"""

from __future__ import annotations

import os
import sys

import ray


@ray.remote(num_cpus=1)
def train(trial_id: int, registry: str, storage: str, steps: int, pause: float) -> int:
    import time

    from ckptstore import core

    with core.init(
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        preempt_signals=False,
        set_trial_state=True,
    ) as context:
        for step in range(1, steps + 1):
            context.train.report_training_metrics(step * 10, {"loss": 1.0 / step})
            context.train.report_validation_metrics(step * 10, {"val_loss": 1.1 / step})
            with context.checkpoint.store_path({"steps_completed": step * 10}) as (path, _uuid):
                with open(os.path.join(path, "weights.bin"), "wb") as f:
                    f.write(os.urandom(4096))
            time.sleep(pause)
    return os.getpid()


def main() -> None:
    trial_id, registry, storage = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    steps, pause = int(sys.argv[4]), float(sys.argv[5])
    ray.init(
        # A fresh local instance, never a cluster this machine already runs (the test session's
        # shared Ray cluster, or another): ray.init() would otherwise join the newest one.
        address="local",
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.2",
        object_store_memory=80 * 2**20,
        log_to_driver=False,
    )
    try:
        pid = ray.get(train.remote(trial_id, registry, storage, steps, pause))
        print(f"ray worker pid {pid}, driver pid {os.getpid()}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
