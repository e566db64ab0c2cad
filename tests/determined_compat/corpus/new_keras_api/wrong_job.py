"""A job that asks for the trial's hyperparameters, which a job does not have."""

import determined as det
import determined.keras

context = det.keras.init()
print("data:", dict(context.config_data))
print(context.training.hparams)
