"""What reading a tf.data epoch batch by batch costs ``fit()`` with ``steps_per_execution``.

A ``tf.data.Dataset`` without ``steps_per_epoch`` whose length ``steps_per_execution`` does not
divide is handed to Keras 3's TensorFlow loop as a Python iterator ending with the pass
(``_TFDatasetData.end_epochs_with_passes``): Keras then runs each batch's compiled step from
Python instead of ``k`` of them in one compiled loop. This A/B runs one tiny Dense model over
1,024 batches of 16 (``steps_per_execution=4``, which divides, so both ways are exact) through
ckptstore's one iterator, handed to Keras as that tf.data iterator (A, the compiled loop) or as
the Python iterator (B), and prints the process CPU seconds of three epochs of ``fit()`` after
one to trace: interleaved, ``--rounds`` each, medians and B/A.

    .venv/bin/python benchmarks/spe_pass_end.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ckptstore as det  # noqa: E402
from ckptstore.keras_io.data import _resumable as rd  # noqa: E402


def fit_cpu(dataset: tf.data.Dataset, python_iterator: bool) -> float:
    """CPU seconds of three epochs of fit() (after one that traces), each epoch's batches
    handed to Keras as a Python iterator or not."""

    def pass_ends(self: rd._TFDatasetData, steps_per_execution: int) -> None:
        self._pass_ends = python_iterator

    rd._TFDatasetData.end_epochs_with_passes = pass_ends  # type: ignore[method-assign]
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss, steps_per_execution=4)
    folder = tempfile.mkdtemp()
    with det.core.init(storage=folder, registry=f"sqlite:///{folder}/r.db", trial_id=1) as core:
        cb = det.keras.DeterminedCallback(core, None, 1, export_saved_model="never")
        model.fit(dataset, epochs=1, verbose=0, callbacks=[cb])
        started = time.process_time()
        model.fit(dataset, epochs=3, verbose=0, callbacks=[cb])
        cpu = time.process_time() - started
        cb.wait()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    x = np.random.RandomState(0).rand(1024 * 16, 32).astype("float32")
    y = (x.sum(axis=1) > 16).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).batch(16)
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for python_iterator in (False, True):
            runs[python_iterator].append(fit_cpu(dataset, python_iterator))
    a, b = statistics.median(runs[False]), statistics.median(runs[True])
    print("A compiled loop, CPU-s:", [round(v, 2) for v in runs[False]])
    print("B batch by batch, CPU-s:", [round(v, 2) for v in runs[True]])
    print(f"medians A {a:.2f} B {b:.2f}, B/A {b / a:.2f}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
