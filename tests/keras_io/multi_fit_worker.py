"""A script that calls ``fit()`` several times with one DeterminedCallback (no tests in here).

    python -m tests.keras_io.multi_fit_worker --dir D --shape finetune|loop [--sigterm-at-step N]

``finetune``: a head trained on a frozen base, then the base unfrozen, the model recompiled
with a new optimizer at a lower learning rate and ``fit()`` again, its epochs numbered on
from the first call's ``History`` (keras-io's transfer learning
guide's shape). ``loop``: ``fit(epochs=1)`` called in a Python loop; ``loop_initial``:
``fit(initial_epoch=e, epochs=e + 1)``. Like a real script, it runs
on to its next ``fit()`` after a preemption. ``--fresh-callbacks``: each ``fit()`` call gets
a new ``DeterminedCallback`` built the same way (instead of one reused). Writes ``<dir>/<tag>.npz`` (every model and
optimizer variable) and ``<dir>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402
from tests.keras_io import keras_under_test as under_test  # noqa: E402

keras = under_test.keras

BATCH = 8
STEPS_PER_EPOCH = 3


class SigtermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM once the trial has trained ``step`` batches."""

    def __init__(self, det_cb, step: int | None):
        super().__init__()
        self.det_cb, self.step = det_cb, step

    def on_train_batch_end(self, batch, logs=None):
        if self.det_cb.steps_completed == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--shape", choices=["finetune", "loop", "loop_initial"], required=True)
    p.add_argument("--sigterm-at-step", type=int, default=None)
    p.add_argument("--tag", default="result")
    p.add_argument("--fresh-callbacks", action="store_true")
    args = p.parse_args(argv)

    keras.utils.set_random_seed(3)
    if (
        under_test.KERAS_MAJOR == 2
    ):  # Dropout's RNG state a checkpointed variable (see resume_worker)
        keras.backend.experimental.enable_tf_random_generator()
    rng = np.random.RandomState(0)
    x = rng.normal(size=(BATCH * STEPS_PER_EPOCH, 5)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    base = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh")])
    layers = [keras.Input((5,)), base, keras.layers.Dropout(0.2), keras.layers.Dense(1)]
    model = keras.Sequential(layers)  # built now on Keras 2 too
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    registry = f"sqlite:///{os.path.join(args.dir, 'registry.db')}"
    storage = os.path.join(args.dir, "ckpts")
    fits = []
    with det.core.init(storage=storage, registry=registry, trial_id=1) as ctx:
        made: list = []

        def callbacks() -> list:
            """This fit() call's callbacks: the one DeterminedCallback, or a new one."""
            if args.fresh_callbacks or not made:
                made.append(
                    det.keras.DeterminedCallback(
                        ctx,
                        checkpoint=ctx.info.latest_checkpoint,
                        continue_id=1,
                        export_saved_model="never",
                    )
                )
            return [made[-1], SigtermAt(made[-1], args.sigterm_at_step)]

        kw = dict(batch_size=BATCH, shuffle=False, verbose=0)
        if args.shape == "finetune":
            base.trainable = False
            model.compile(keras.optimizers.Adam(0.01), loss=loss)
            history = model.fit(x, y, epochs=2, callbacks=callbacks(), **kw)
            fits.append(history.epoch)
            base.trainable = True
            model.compile(keras.optimizers.Adam(0.001), loss=loss)
            # the epochs go on from the first phase's (TensorFlow's transfer learning tutorial)
            start = history.epoch[-1] + 1
            fits.append(
                model.fit(
                    x, y, epochs=start + 2, initial_epoch=start, callbacks=callbacks(), **kw
                ).epoch
            )
        else:
            model.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss=loss)
            for epoch in range(3):  # loop_initial: as a continuation of the epochs before
                start = {"initial_epoch": epoch} if args.shape == "loop_initial" else {}
                end = len(start) * epoch + 1
                fits.append(model.fit(x, y, epochs=end, callbacks=callbacks(), **start, **kw).epoch)
        det_cb = made[-1]
        det_cb.wait()
        summary = {
            "steps_completed": det_cb.steps_completed,
            "fits": fits,
            "preempted": ctx.preempt.acknowledged,
            "iterations": int(model.optimizer.iterations.numpy()),
        }
    arrays = {f"model/{under_test.variable_path(v)}": v.numpy() for v in model.variables}
    arrays.update(
        {
            f"optimizer/{under_test.variable_path(v)}": v.numpy()
            for v in under_test.optimizer_variables(model)
        }
    )
    np.savez(os.path.join(args.dir, f"{args.tag}.npz"), **arrays)
    with open(os.path.join(args.dir, f"{args.tag}.json"), "w") as f:
        json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
