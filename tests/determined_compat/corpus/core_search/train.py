"""A Core API script in the shape of Determined's core_api tutorials: it trains for as long as
each searcher operation asks, validates, and reports the searcher metric. The "model" is one
weight fitted by gradient descent in NumPy (no TensorFlow), so many trials run quickly."""

import logging

import determined as det
import numpy as np


def main(core_context):
    hparams = core_context.info.trial.hparams if core_context.info else {"lr": 0.1}
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=256)
    y = 3.0 * x + rng.normal(scale=0.05, size=256)
    weight, batches = 0.0, 0
    for op in core_context.searcher.operations():
        while batches < op.length:
            i = batches % 8 * 32
            xb, yb = x[i : i + 32], y[i : i + 32]
            weight -= hparams["lr"] * float(np.mean(2 * (weight * xb - yb) * xb))
            batches += 1
            if batches % 4 == 0:
                op.report_progress(batches)
        val_loss = float(np.mean((weight * x - y) ** 2))
        core_context.train.report_validation_metrics(batches, {"val_loss": val_loss})
        op.report_completed(val_loss)
    print(f"TRAINED {batches} BATCHES")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with det.core.init() as core_context:
        main(core_context)
