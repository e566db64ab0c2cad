"""A training script in the shape of Determined 0.38's Keras examples (DeterminedCallback +
TensorBoard, ``det.core.init()`` reading the trial from its environment), with the one edit
the README asks for: ``import ckptstore as det``."""

import logging

import keras
import numpy as np

import ckptstore as det


def build_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def main(core_context: det.core.Context) -> None:
    info = det.get_cluster_info()
    assert info is not None, "run this as a trial (CKPTSTORE_TRIAL_ID set)"
    rng = np.random.default_rng(info.trial.trial_seed)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = build_model()
    callbacks = [
        det.keras.DeterminedCallback(
            core_context,
            checkpoint=info.latest_checkpoint,
            continue_id=info.trial.trial_id,
            train_metrics_report_period=4,
        ),
        det.keras.TensorBoard(core_context, update_freq="batch", profile_batch=0),
    ]
    epochs = info.trial.hparams.get("epochs", 3)
    model.fit(
        x, y, validation_split=0.25, batch_size=8, epochs=epochs, callbacks=callbacks, verbose=0
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        main(core_context)
