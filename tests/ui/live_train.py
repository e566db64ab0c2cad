"""A tiny, paced Keras training run for the browser test: it reports metrics and commits a
checkpoint every epoch through DeterminedCallback, into the trial ``CKPTSTORE_TRIAL_ID`` of
the registry and storage named by ``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE``, sleeping
between epochs so a person (or Playwright) watching the trial page sees each step arrive.

Run: ``python -m tests.ui.live_train EPOCHS SECONDS_PER_EPOCH``
"""

from __future__ import annotations

import sys
import time

import keras
import numpy as np

import ckptstore as det


class Pace(keras.callbacks.Callback):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(self.seconds)


def main() -> None:
    epochs, seconds = int(sys.argv[1]), float(sys.argv[2])
    keras.utils.set_random_seed(1)
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = (x.sum(axis=1) > 2).astype("int64")
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    with det.core.init(preempt_signals=False, set_trial_state=True) as core_context:
        callback = det.keras.DeterminedCallback(
            core_context,
            checkpoint=None,
            continue_id=core_context.info.trial.trial_id,
            # the page shows checkpoints and metrics; a SavedModel export (a TensorFlow worker
            # process) would only make the run's end later
            export_saved_model="never",
        )
        model.fit(
            x,
            y,
            batch_size=16,
            epochs=epochs,
            validation_data=(x, y),
            verbose=0,
            callbacks=[callback, Pace(seconds)],
        )


if __name__ == "__main__":
    main()
