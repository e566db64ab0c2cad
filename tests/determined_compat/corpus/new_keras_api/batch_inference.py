"""The reference's batch-inference script in our own words: load a model trained in an
experiment (by trial id or checkpoint UUID from the config's data), predict on sharded data,
evaluate it, and upload the predictions."""

import determined as det
import determined.keras
import numpy as np
from tensorflow import keras

context = det.keras.init()

trial_id = context.config_data.get("trial_id")
checkpoint_uuid = context.config_data.get("checkpoint_uuid")
model = context.load_checkpoint_model(trial_id=trial_id, checkpoint_uuid=checkpoint_uuid)

rng = np.random.RandomState(7)
labels = rng.randint(0, 10, size=203)  # an odd number of rows: uneven shards
images = rng.uniform(0.0, 0.3, size=(203, 8, 8, 1)).astype("float32")
images[np.arange(203), labels // 8 * 4, labels % 8, 0] += 1.0

data, targets = context.wrap_data(images, keras.utils.to_categorical(labels, 10))
batch_size = context.config_data["batch_size"]

predictions = context.predict(model, data, batch_size=batch_size, verbose=0)
context.evaluate(model, data, targets, batch_size=batch_size, verbose=0)

url = context.write_output("predictions.npy", predictions)
print("wrote", predictions.shape, "to", url)
