"""A Core API script the Determined 0.38 way: no searcher operations; it reports validation
metrics with a `batches` entry and stops when asked (`should_preempt`), which is how 0.38's
ASHA stopped trials it pruned. NumPy only, like train.py beside it."""

import logging

import determined as det
import numpy as np


def main(core_context, max_batches):
    hparams = core_context.info.trial.hparams
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=256)
    y = 3.0 * x + rng.normal(scale=0.05, size=256)
    weight, batches = 0.0, 0
    while batches < max_batches:
        for _ in range(8):  # one "epoch"
            i = batches % 8 * 32
            xb, yb = x[i : i + 32], y[i : i + 32]
            weight -= hparams["lr"] * float(np.mean(2 * (weight * xb - yb) * xb))
            batches += 1
        val_loss = float(np.mean((weight * x - y) ** 2))
        core_context.train.report_validation_metrics(
            batches, {"val_loss": val_loss, "batches": batches}
        )
        if core_context.preempt.should_preempt():
            print(f"STOPPED AT {batches} BATCHES")
            return
    print(f"TRAINED {batches} BATCHES")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with det.core.init() as core_context:
        main(core_context, max_batches=64)
