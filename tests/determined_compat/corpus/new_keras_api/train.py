"""The reference's "new Keras API" training script in our own words, with small synthetic
digits (8x8, ten classes) in place of MNIST: det.keras.init, context.training.hparams,
wrap_data, wrap_optimizer, distributed.shard_batch_size and context.fit."""

import determined as det
import determined.keras
import numpy as np
from tensorflow import keras
from tensorflow.keras import layers

context = det.keras.init()
hparams = context.training.hparams

num_classes = 10
input_shape = (8, 8, 1)


def synthetic_digits(n, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, num_classes, size=n)
    images = rng.uniform(0.0, 0.3, size=(n, 8, 8, 1)).astype("float32")
    images[np.arange(n), labels // 8 * 4, labels % 8, 0] += 1.0
    return images, keras.utils.to_categorical(labels, num_classes)


x_train, y_train = synthetic_digits(320, seed=0)
x_test, y_test = synthetic_digits(64, seed=1)

x_train, y_train = context.wrap_data(x_train, y_train)
x_test, y_test = context.wrap_data(x_test, y_test)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dropout(hparams["dropout"]),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

optimizer = keras.optimizers.SGD(hparams["learning_rate"])
optimizer = context.wrap_optimizer(optimizer)
model.compile(loss="categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])

global_batch_size = hparams["global_batch_size"]
batch_size = context.distributed.shard_batch_size(global_batch_size)

hist = context.fit(
    model,
    x=x_train,
    y=y_train,
    batch_size=batch_size,
    epochs=3,
    validation_data=(x_test, y_test),
    verbose=0,
)

print("Test loss:", hist.history["val_loss"][-1])
print("Test accuracy:", hist.history["val_accuracy"][-1])
