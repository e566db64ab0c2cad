"""Training script of the cross-backend tests (no tests in here): one Keras 3 backend per process.

    KERAS_BACKEND=jax python -m tests.keras_io.backend_worker --dir D --epochs 2 --out r.json

Resumes trial 1 of the store in ``D`` (its latest checkpoint, same ``continue_id``) up to
``--epochs`` epochs with DeterminedCallback, then writes ``--out``: the backend, whether it
resumed, the optimizer's ``iterations`` and Adam slots as loaded (before any step), the last
checkpoint, and the predictions of ``det.load_checkpoint_model`` on a fixed input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402

STEPS = 4  # batches per epoch


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype("float32")
    return x, (x[:, :2] * 1.5 - x[:, 2:4]).astype("float32")


def build() -> keras.Model:
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)]
    )
    model.compile(keras.optimizers.Adam(0.01), loss="mse")
    return model


class _AsLoaded(keras.callbacks.Callback):
    """Records the optimizer state fit() starts from (after DeterminedCallback restored it)."""

    def __init__(self, out: dict) -> None:
        super().__init__()
        self.out = out

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        self.out["iterations_at_start"] = int(np.asarray(optimizer.iterations.numpy()))
        self.out["slots_at_start"] = {
            v.path: np.asarray(v.numpy()).tolist() for v in optimizer.variables[2:]
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    x, y = data()
    out: dict = {"backend": keras.backend.backend()}
    registry = f"sqlite:///{os.path.join(args.dir, 'registry.db')}"
    with det.core.init(
        storage=os.path.join(args.dir, "ckpts"), registry=registry, trial_id=1
    ) as core:
        cb = det.keras.DeterminedCallback(
            core, core.info.latest_checkpoint, continue_id=1, export_saved_model="never"
        )
        model = build()
        model.fit(
            x, y, batch_size=len(x) // STEPS, epochs=args.epochs, verbose=0,
            callbacks=[cb, _AsLoaded(out)],
        )  # fmt: skip
        out["resumed"] = cb.resumed
        out["last_checkpoint"] = cb.last_checkpoint
        out["slots_now"] = {
            v.path: np.asarray(v.numpy()).tolist() for v in model.optimizer.variables[2:]
        }
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=out["last_checkpoint"],
        storage=os.path.join(args.dir, "ckpts"),
        registry=registry,
    )
    out["predictions"] = np.asarray(loaded.predict(x[:5], verbose=0)).tolist()
    out["fit_predictions"] = np.asarray(model.predict(x[:5], verbose=0)).tolist()
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
