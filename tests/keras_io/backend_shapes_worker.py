"""Training scripts in the shapes keras-io writes for JAX and PyTorch (a ``train_step`` of the
backend's own style, ``keras.distribution``'s ``DataParallel`` and ``ModelParallel``, a GAN
with its own ``SeedGenerator``, augmentation layers, gradient accumulation,
``steps_per_execution``), and keras-io's backend-agnostic scripts (tf.data, TextVectorization,
PyDataset, a generator, objects of the script, Keras's stateful callbacks), run as a user runs them
(``python tests/keras_io/backend_shapes_worker.py``: their classes live in ``__main__``). No
tests in here; ``tests/keras_io/test_backend_shapes.py`` runs it in the JAX and PyTorch child
runs.

    KERAS_BACKEND=jax python tests/keras_io/backend_shapes_worker.py --dir D --phase first|final

Each phase runs every shape of this process's backend in turn (each with its own storage,
registry and seed, built in the same order in every phase, so layer names agree): ``first``
trains each shape 2 epochs of 4 steps with ``DeterminedCallback`` (``straight``), then again
sending itself a real SIGTERM after step ``SIGTERM_AT`` (a shape's own ``sigterm_at``: batch-end
calls) inside epoch 2 (``part``); ``final`` (a new process, as after a preemption) resumes from
the latest checkpoint, finishes, loads the last checkpoint by UUID and compares its predictions
with the trained model's. Writes
``D/<phase>.json`` (per shape: steps, resumed, last epoch's logs, load result, errors) and
``D/<phase>-<shape>.npz`` (model and optimizer variables, by position).

The distributed shapes need two JAX devices: the test starts this script with
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (two host CPU devices).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import ckptstore as det  # noqa: E402

BACKEND = keras.backend.backend()
BATCH = 4
STEPS = 4  # per epoch
EPOCHS = 2
N = BATCH * STEPS
SIGTERM_AT = 6  # inside epoch 2 (and between two updates of the accumulating optimizer)


def numbers(features: int = 4, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(N, features).astype("float32")
    return x, (x.sum(axis=1) * 2.3).astype("int64") % classes


def dense_body(inputs: Any) -> Any:
    """Dense -> Dropout (its SeedGenerator state moves every step) -> Dense logits."""
    h = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.layers.Dense(3)(keras.layers.Dropout(0.25)(h))


# ---- train_step in the backend's own style, with its own metric trackers --------------------
class TrackedModel(keras.Model):
    """The keras-io "going lower-level" model: compile() gets the optimizer only; the loss and
    the metrics are the model's own trackers (reset by fit() at each epoch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="acc")
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @property
    def metrics(self) -> list[Any]:
        return [self.loss_tracker, self.accuracy]


class StatelessStep(TrackedModel):
    """JAX: a pure train_step over the state fit() hands it (stateless_call, stateless_apply,
    the trackers' stateless updates); returns (logs, state). The same for test_step."""

    def _loss(self, trainable, non_trainable, x, y):
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=True)
        return self.loss_fn(y, y_pred), (y_pred, non_trainable)

    def _tracked(self, metrics_vars, loss, y, y_pred):
        """The trackers' updated variables and their results (stateless)."""
        cut = len(self.loss_tracker.variables)
        loss_vars = self.loss_tracker.stateless_update_state(metrics_vars[:cut], loss)
        acc_vars = self.accuracy.stateless_update_state(metrics_vars[cut:], y, y_pred)
        logs = {
            "loss": self.loss_tracker.stateless_result(loss_vars),
            "acc": self.accuracy.stateless_result(acc_vars),
        }
        return logs, loss_vars + acc_vars

    def train_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer_vars, metrics_vars = state
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)
        (loss, (y_pred, non_trainable)), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        logs, metrics_vars = self._tracked(metrics_vars, loss, y, y_pred)
        return logs, (trainable, non_trainable, optimizer_vars, metrics_vars)

    def test_step(self, state, data):
        trainable, non_trainable, metrics_vars = state
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=False)
        logs, metrics_vars = self._tracked(metrics_vars, self.loss_fn(y, y_pred), y, y_pred)
        return logs, (trainable, non_trainable, metrics_vars)


class TorchStep(TrackedModel):
    """PyTorch: zero_grad(), a forward pass, backward(), optimizer.apply() under no_grad."""

    def train_step(self, data):
        import torch

        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        self.zero_grad()
        y_pred = self(x, training=True)
        loss = self.loss_fn(y, y_pred)
        loss.backward()
        weights = list(self.trainable_weights)
        with torch.no_grad():
            self.optimizer.apply([w.value.grad for w in weights], weights)
        self.loss_tracker.update_state(loss)
        self.accuracy.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


@dataclasses.dataclass
class Shape:
    """A model and how fit() trains it, what it predicts on, how it loads."""

    model: Any
    data: tuple[Any, ...]
    fit: dict[str, Any] = dataclasses.field(default_factory=dict)
    sample: Any = None
    load: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: entered around building, training and loading (a keras.distribution scope)
    scope: Any = contextlib.nullcontext
    #: SIGTERM after this many batch-end calls of the run (one per execution)
    sigterm_at: int = SIGTERM_AT
    epochs: int = EPOCHS
    #: the script's own callbacks (given the shape's folder), listed before DeterminedCallback
    callbacks: Any = lambda folder: []


ARRAYS = {"batch_size": BATCH, "shuffle": True}


def _own_step(cls: type) -> Shape:
    x, y = numbers()
    inputs = keras.Input((4,))
    model = cls(inputs, dense_body(inputs))
    model.compile(keras.optimizers.Adam(0.01))
    return Shape(model, (x, y), ARRAYS, x, {"custom_objects": {cls.__name__: cls}})


def shape_jax_stateless_train_step() -> Shape:
    shape = _own_step(StatelessStep)  # with its own test_step on validation data
    shape.fit = {**shape.fit, "validation_data": numbers()}
    return shape


def shape_torch_train_step() -> Shape:
    return _own_step(TorchStep)


def _compiled(model: Any, optimizer: Any = None) -> Any:
    model.compile(
        optimizer or keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _two_devices() -> list[Any]:
    import jax

    devices = jax.devices()
    if len(devices) != 2:
        raise RuntimeError(f"needs 2 JAX devices (XLA_FLAGS), found {devices}")
    return devices


#: The sharding of the input batch of every train step JAX compiled in this run.
BATCH_SPECS: list[str] = []


class ShardingProbe(keras.Model):
    """Records the sharding of the batch the compiled train step receives (DataParallel splits
    it along the batch dimension: ``PartitionSpec('batch',)``, recorded as ``"batch"``)."""

    def train_step(self, state, data):
        import jax

        x = keras.utils.unpack_x_y_sample_weight(data)[0]
        jax.debug.inspect_array_sharding(x, callback=lambda s: BATCH_SPECS.append(_split(s.spec)))
        return super().train_step(state, data)


def _split(spec: Any) -> str:
    """How a PartitionSpec splits an array: its mesh axes by dimension, or ``"replicated"``."""
    return " ".join(str(axis) for axis in spec) or "replicated"


def _distributed(distribution: Any) -> Shape:
    with distribution.scope():
        x, y = numbers()
        inputs = keras.Input((4,))
        h = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
        outputs = keras.layers.Dense(3)(keras.layers.Dropout(0.25)(h))
        model = _compiled(ShardingProbe(inputs, outputs))
    load = {"custom_objects": {"ShardingProbe": ShardingProbe}}
    return Shape(model, (x, y), ARRAYS, x, load, scope=distribution.scope)


def shape_jax_data_parallel() -> Shape:
    """keras.distribution.DataParallel over the host's devices (two: XLA_FLAGS): every variable
    replicated on both, each batch split between them."""
    return _distributed(keras.distribution.DataParallel(devices=_two_devices()))


def shape_jax_model_parallel() -> Shape:
    """keras.distribution.ModelParallel: the hidden layer's kernel and bias (and their Adam
    slots) sharded between the two devices, the rest replicated."""
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices=_two_devices())
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["hidden/kernel"] = (None, "model")
    layouts["hidden/bias"] = ("model",)
    return _distributed(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    )


def _images() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    x = rng.rand(N, 6, 6, 1).astype("float32")
    return x, (x.mean(axis=(1, 2, 3)) * 9).astype("int64") % 3


def _classifier(*front: Any) -> Any:
    layers = [keras.layers.Conv2D(2, 3), keras.layers.GlobalAveragePooling2D()]
    model = keras.Sequential([keras.Input((6, 6, 1)), *front, *layers, keras.layers.Dense(3)])
    return _compiled(model)


def shape_augmentation() -> Shape:
    """Augmentation layers in the model (keras-io's image classifiers): each draws from its
    SeedGenerator, whose state is no weight of the .keras format."""
    x, y = _images()
    augment = [
        keras.layers.RandomFlip("horizontal"),
        keras.layers.RandomBrightness(0.2, value_range=(0.0, 1.0)),
        keras.layers.RandomContrast(0.3),
    ]
    return Shape(_classifier(*augment), (x, y), ARRAYS, x)


def shape_augmentation_in_tf_data() -> Shape:
    """The other keras-io way: the augmentation layers map a tf.data pipeline (they run on
    TensorFlow there, whatever the backend), the model trains on what it yields."""
    import tensorflow as tf

    x, y = _images()
    flip, shift = keras.layers.RandomFlip("horizontal"), keras.layers.RandomTranslation(0.2, 0.2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=2).batch(BATCH)
    ds = ds.map(lambda images, labels: (shift(flip(images)), labels))
    return Shape(_classifier(), (ds,), {"shuffle": False}, x)


def shape_gradient_accumulation() -> Shape:
    """An optimizer that applies the mean of every 4 steps' gradients: SIGTERM after step 6
    leaves 2 steps' gradients accumulated (BatchNormalization's statistics move every step)."""
    x, y = numbers()
    inputs = keras.Input((4,))
    model = keras.Model(inputs, dense_body(keras.layers.BatchNormalization()(inputs)))
    optimizer = keras.optimizers.Adam(0.01, gradient_accumulation_steps=4)
    return Shape(_compiled(model, optimizer), (x, y), ARRAYS, x)


def shape_jax_steps_per_execution() -> Shape:
    """``compile(steps_per_execution=2)`` over a shuffled tf.data epoch of 3 batches (executions
    of 2 and 1; PyTorch's Keras refuses k > 1): SIGTERM after epoch 2's first execution."""
    import tensorflow as tf

    x, y = numbers()
    ds = tf.data.Dataset.from_tensor_slices((x[:12], y[:12])).shuffle(12, seed=4).batch(BATCH)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, dense_body(inputs))
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=2,
    )
    return Shape(model, (ds,), {"shuffle": False}, x, sigterm_at=3)


class SeededGAN(keras.Model):
    """keras-io's PyTorch GAN, tiny: two optimizers, latent points and label noise drawn from
    the model's own SeedGenerator (a variable no layer saves), trackers for both losses."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.discriminator = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(1)]
        )
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self) -> list[Any]:
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer: Any, g_optimizer: Any) -> None:
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, z: Any) -> Any:
        return self.generator(z)

    def _step(self, net: Any, optimizer: Any, labels: Any, inputs: Any) -> Any:
        import torch

        self.zero_grad()
        loss = self.loss_fn(labels, self.discriminator(inputs))
        loss.backward()
        weights = list(net.trainable_weights)
        with torch.no_grad():
            optimizer.apply([w.value.grad for w in weights], weights)
        return loss

    def train_step(self, real: Any) -> dict[str, Any]:
        import torch

        real = real[0] if isinstance(real, tuple) else real
        n = real.shape[0]
        z = keras.random.normal((n, 2), seed=self.seed_generator)
        labels = torch.cat([torch.ones((n, 1)), torch.zeros((n, 1))])
        labels = labels + 0.05 * keras.random.uniform(labels.shape, seed=self.seed_generator)
        both = torch.cat([self.generator(z).detach(), real])
        d_loss = self._step(self.discriminator, self.d_optimizer, labels, both)
        z = keras.random.normal((n, 2), seed=self.seed_generator)
        g_loss = self._step(
            self.generator, self.g_optimizer, torch.zeros((n, 1)), self.generator(z)
        )
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


def shape_torch_gan_seed_generator() -> Shape:
    x, _ = numbers()
    gan = SeededGAN()
    gan.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    gan(np.zeros((1, 2), "float32"))  # built before fit, as a loader needs it
    z = np.linspace(-1, 1, 2 * N, dtype="float32").reshape(N, 2)
    return Shape(gan, (x,), ARRAYS, z, {"custom_objects": {"SeededGAN": SeededGAN}})


# ---- keras-io's backend-agnostic scripts: tf.data input, TextVectorization, PyDataset, a
# generator, objects of the script, Keras's stateful callbacks --------------------------------
def _convnet() -> Any:
    """mnist_convnet's model, tiny: Conv2D, MaxPooling2D, Flatten, Dropout, a softmax Dense."""
    layers = keras.layers
    model = keras.Sequential(
        [keras.Input((6, 6, 1)), layers.Conv2D(4, 3, activation="relu"), layers.MaxPooling2D()]
    )
    for layer in (layers.Flatten(), layers.Dropout(0.5), layers.Dense(3, activation="softmax")):
        model.add(layer)
    model.compile(
        keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def shape_tfdata_stateless_augment() -> Shape:
    """image_classification_from_scratch's pipeline (shuffle with a seed, batch, map with
    num_parallel_calls, prefetch; a tf.data validation set), one pass an epoch, its augmentation
    stateless and seeded from a counter zipped in (TensorFlow's augmentation guide's way)."""
    import tensorflow as tf

    def augment(batch: Any, count: Any) -> Any:
        images, labels = batch
        seed = tf.stack([count, tf.constant(7, tf.int64)])
        images = tf.image.stateless_random_flip_left_right(images, seed)
        return tf.image.stateless_random_brightness(images, 0.2, seed), labels

    x, y = _images()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=5).batch(BATCH)
    ds = tf.data.Dataset.zip((ds, tf.data.experimental.Counter()))
    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val = tf.data.Dataset.from_tensor_slices(_images()).batch(BATCH)
    return Shape(_convnet(), (ds,), {"validation_data": val}, x)


def _dense_model(optimizer: Any = None) -> Any:
    inputs = keras.Input((4,))
    return _compiled(keras.Model(inputs, dense_body(inputs)), optimizer)


def shape_tfdata_cache_repeat_steps() -> Shape:
    """The tf.data guide's order (map, cache, shuffle with a seed, batch, repeat, prefetch) with
    steps_per_epoch=5 over passes of 4 batches: SIGTERM in epoch 2 reads from the cache
    filled in the first pass, a pass ending inside each epoch."""
    import tensorflow as tf

    x, y = numbers()
    ds = tf.data.Dataset.from_tensor_slices((x * 255.0, y)).map(lambda a, b: (a / 255.0, b))
    ds = ds.cache().shuffle(N, seed=6).batch(BATCH).repeat().prefetch(tf.data.AUTOTUNE)
    return Shape(_dense_model(), (ds,), {"steps_per_epoch": 5}, x)


WORDS = "good great fine fun bad awful dull slow plot cast film the a".split()


def _reviews(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    texts = [" ".join(rng.choice(WORDS, rng.randint(3, 8))).title() + "!<br />" for _ in range(n)]
    score = [sum((w in WORDS[:4]) - (w in WORDS[4:8]) for w in t.lower().split()) for t in texts]
    return np.array(texts), (np.array(score) > 0).astype("float32")


def shape_text_vectorization_tfdata() -> Shape:
    """text_classification_from_scratch: TextVectorization adapted on the raw string dataset and
    mapped over it, then cache() and prefetch(); an Embedding + Conv1D model on the indices.
    (Its custom ``standardize`` function fails in dataset.map() on JAX and PyTorch with Keras
    3.15, with or without ckptstore, which hands it NumPy strings there: the default here.)"""
    import tensorflow as tf

    vectorize = keras.layers.TextVectorization(max_tokens=16, output_sequence_length=6)
    raw = tf.data.Dataset.from_tensor_slices(_reviews(N, 7)).shuffle(N, seed=8).batch(BATCH)
    vectorize.adapt(raw.map(lambda text, label: text))

    def indices(text: Any, label: Any) -> Any:
        return vectorize(tf.expand_dims(text, -1)), label

    train = raw.map(indices).cache().prefetch(10)
    val = tf.data.Dataset.from_tensor_slices(_reviews(8, 9)).batch(BATCH).map(indices)
    texts = tf.data.Dataset.from_tensor_slices(_reviews(N, 7)[0]).batch(N)
    sample = next(iter(texts.map(lambda t: vectorize(tf.expand_dims(t, -1))))).numpy()
    inputs = keras.Input((None,), dtype="int64")
    h = keras.layers.Dropout(0.5)(keras.layers.Embedding(16, 8)(inputs))
    h = keras.layers.Conv1D(4, 3, activation="relu")(h)
    h = keras.layers.Dense(4, activation="relu")(keras.layers.GlobalMaxPooling1D()(h))
    outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dropout(0.5)(h))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    return Shape(model, (train,), {"validation_data": val.cache()}, sample)


class EpochShuffled(keras.utils.PyDataset):
    """A PyDataset in keras-io's shape (batches indexed from arrays) that reorders its samples
    in on_epoch_end from its epoch count; get_state/load_state carry the count over a resume."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs: Any) -> None:
        super().__init__(workers=1, use_multiprocessing=False, **kwargs)
        self.x, self.y, self.epoch = x, y, 0
        self.order = np.arange(len(x))

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.order[i * BATCH : (i + 1) * BATCH]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self) -> None:
        self.load_state({"epoch": self.epoch + 1})

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.order = np.random.RandomState(self.epoch).permutation(len(self.x))


def shape_pydataset_workers_1() -> Shape:
    x, y = numbers()
    return Shape(_dense_model(), (EpochShuffled(x, y),), {}, x)


def shape_generator_steps_per_epoch() -> Shape:
    """An endless seeded generator of shuffled batches with steps_per_epoch=3 (passes of 4)."""
    x, y = numbers()

    def batches() -> Any:
        rng = np.random.RandomState(9)
        while True:
            order = rng.permutation(N)
            for i in range(0, N, BATCH):
                yield x[order[i : i + BATCH]], y[order[i : i + BATCH]]

    return Shape(_dense_model(), (batches(),), {"steps_per_epoch": 3}, x, sigterm_at=4)


class ScaledDense(keras.layers.Layer):
    """A layer of the script: its own weights, an argument get_config() records."""

    def __init__(self, units: int, scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.scale = units, scale

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        return keras.ops.relu(keras.ops.matmul(inputs, self.kernel) * self.scale + self.bias)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "scale": self.scale}


class TrueClassProbability(keras.metrics.Metric):
    """A metric of the script with its own state: the mean probability of the true class."""

    def __init__(self, name: str = "true_p", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        rows = keras.ops.cast(keras.ops.reshape(y_true, (-1, 1)), "int32")
        p = keras.ops.take_along_axis(y_pred, rows, axis=1)
        self.total.assign_add(keras.ops.sum(p))
        self.count.assign_add(keras.ops.sum(keras.ops.ones_like(p)))

    def result(self) -> Any:
        return self.total / keras.ops.maximum(self.count, 1.0)


def smoothed_crossentropy(y_true: Any, y_pred: Any) -> Any:
    """A loss function of the script, given to compile() as the object."""
    rows = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
    return keras.losses.categorical_crossentropy(keras.ops.one_hot(rows, 3) * 0.9 + 0.1 / 3, y_pred)


def shape_script_objects() -> Shape:
    """A layer, a metric and a loss function defined in the script, BatchNormalization and
    Dropout (its SeedGenerator) in the model; loaded with custom_objects."""
    x, y = numbers()
    inputs = keras.Input((4,))
    h = keras.layers.BatchNormalization()(ScaledDense(8, scale=0.5)(inputs))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dropout(0.3)(h))
    model = keras.Model(inputs, outputs)
    metrics = [TrueClassProbability(), "accuracy"]
    model.compile(keras.optimizers.Adam(0.01), loss=smoothed_crossentropy, metrics=metrics)
    objects = (ScaledDense, TrueClassProbability, smoothed_crossentropy)
    load = {"custom_objects": {o.__name__: o for o in objects}}
    return Shape(model, (x, y), {**ARRAYS, "validation_data": numbers()}, x, load)


def keras_io_callbacks(folder: str) -> list[Any]:
    """timeseries_classification_from_scratch's callbacks (ModelCheckpoint of the best,
    ReduceLROnPlateau, EarlyStopping), EarlyStopping restoring the best weights. Their
    ``min_delta`` makes every epoch after the first one count as no better, whatever the
    backend's numbers: the rate halves after epochs 2 and 3, EarlyStopping stops after epoch 3
    (``baseline`` keeps epoch 1 from resetting its wait) and puts epoch 1's weights back."""
    path = os.path.join(folder, "best_model.keras")
    plateau = {"monitor": "val_loss", "min_delta": 10.0}
    return [
        keras.callbacks.ModelCheckpoint(path, save_best_only=True, monitor="val_loss"),
        keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=1, **plateau),
        keras.callbacks.EarlyStopping(
            patience=3, baseline=-1.0, restore_best_weights=True, **plateau
        ),
    ]


def shape_keras_callbacks() -> Shape:
    """4 epochs with keras-io's callbacks (listed before DeterminedCallback); SIGTERM in epoch
    3, between the two learning-rate cuts."""
    model = _dense_model(keras.optimizers.Adam(0.05))
    fit = {**ARRAYS, "validation_data": numbers()}
    x = fit["validation_data"][0]
    return Shape(model, numbers(), fit, x, epochs=4, sigterm_at=10, callbacks=keras_io_callbacks)


#: shape -> the backends it runs on
SHAPES = {
    "jax_stateless_train_step": (shape_jax_stateless_train_step, ("jax",)),
    "torch_train_step": (shape_torch_train_step, ("torch",)),
    "torch_gan_seed_generator": (shape_torch_gan_seed_generator, ("torch",)),
    "jax_data_parallel": (shape_jax_data_parallel, ("jax",)),
    "jax_model_parallel": (shape_jax_model_parallel, ("jax",)),
    "augmentation": (shape_augmentation, ("jax", "torch")),
    "augmentation_in_tf_data": (shape_augmentation_in_tf_data, ("jax", "torch")),
    "gradient_accumulation": (shape_gradient_accumulation, ("jax", "torch")),
    "jax_steps_per_execution": (shape_jax_steps_per_execution, ("jax",)),
    "tfdata_stateless_augment": (shape_tfdata_stateless_augment, ("jax", "torch")),
    "tfdata_cache_repeat_steps": (shape_tfdata_cache_repeat_steps, ("jax", "torch")),
    "text_vectorization_tfdata": (shape_text_vectorization_tfdata, ("jax", "torch")),
    "pydataset_workers_1": (shape_pydataset_workers_1, ("jax", "torch")),
    "generator_steps_per_epoch": (shape_generator_steps_per_epoch, ("jax", "torch")),
    "script_objects": (shape_script_objects, ("jax", "torch")),
    "keras_callbacks": (shape_keras_callbacks, ("jax", "torch")),
}


def shapes_here() -> list[str]:
    return [name for name, (_fn, backends) in SHAPES.items() if BACKEND in backends]


class Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process right after batch ``step`` of this run; records the epochs'
    logs, and where the first kernel lives when epoch 2 begins (after the epoch-1 checkpoint
    gave the variables copies, or after a resume loaded them)."""

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.step, self.steps_here, self.epoch_logs = step, 0, []
        self.epoch, self.epoch2_layout = 0, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and self.epoch2_layout is None:
            self.epoch2_layout = _layout(self.model.trainable_variables[0])

    def on_train_batch_end(self, batch, logs=None):
        self.steps_here += 1
        if self.step is not None and self.steps_here == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append({k: float(v) for k, v in (logs or {}).items()})


def run_shape(name: str, phase: str, root: str) -> dict[str, Any]:
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    tag = "-straight" if phase == "straight" else ""
    storage = os.path.join(folder, "ckpts" + tag)
    registry = f"sqlite:///{os.path.join(folder, f'registry{tag}.db')}"
    keras.backend.clear_session()  # the same layer (and RNG state) names in every process
    keras.utils.set_random_seed(3)
    shape = SHAPES[name][0]()
    model = shape.model
    sigterm = Sigterm(shape.sigterm_at if phase == "part" else None)
    out: dict[str, Any] = {"shape": name}
    with shape.scope(), det.core.init(storage=storage, registry=registry, trial_id=1) as core:
        cb = det.keras.DeterminedCallback(
            core, core.info.latest_checkpoint, continue_id=1, export_saved_model="never"
        )
        callbacks = [sigterm, *shape.callbacks(folder), cb]
        model.fit(*shape.data, epochs=shape.epochs, verbose=0, callbacks=callbacks, **shape.fit)
        out.update(preempted=bool(core.preempt.acknowledged), resumed=cb.resumed)
        out.update(steps_here=sigterm.steps_here, logs=sigterm.epoch_logs[-1:])
        # a GAN steps its own optimizers (its compiled one never steps)
        optimizers = [
            getattr(model, k) for k in ("d_optimizer", "g_optimizer") if hasattr(model, k)
        ]
        optimizers = optimizers or [model.optimizer]
        out["iterations"] = [int(keras.ops.convert_to_numpy(o.iterations)) for o in optimizers]
        out["layout"] = _layout(model.trainable_variables[0])
        out["learning_rate"] = float(keras.ops.convert_to_numpy(optimizers[0].learning_rate))
        out["epoch2_layout"] = sigterm.epoch2_layout
        out["batch_specs"] = sorted(set(BATCH_SPECS))
        BATCH_SPECS.clear()
        arrays = {f"model/{i:03d}": _numpy(v) for i, v in enumerate(model.variables)}
        slots = [v for o in optimizers for v in o.variables]
        arrays.update({f"opt/{i:03d}": _numpy(v) for i, v in enumerate(slots)})
        np.savez(os.path.join(root, f"{phase}-{name}.npz"), **arrays)
        if phase == "final":
            out["load"] = _load(model, shape, cb.last_checkpoint, storage, registry)
    if phase == "final" and shape.scope is not contextlib.nullcontext:
        # the same checkpoint on one device (no distribution): the same predictions
        got = _load(model, shape, cb.last_checkpoint, storage, registry)
        out["load_on_one_device"] = got
    return out


def _load(model: Any, shape: Shape, uuid: str, storage: str, registry: str) -> dict[str, Any]:
    """Loads checkpoint ``uuid`` by UUID: its layout, and how its predictions compare."""
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=storage, registry=registry, **shape.load
    )
    want, got = (m.predict(shape.sample, batch_size=BATCH, verbose=0) for m in (model, loaded))
    return {
        "predict_equal": bool(np.array_equal(want, got)),
        "max_diff": float(np.max(np.abs(want - got))),
        "layout": _layout(loaded.trainable_variables[0]),
    }


def _numpy(variable: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable.value))


def _layout(variable: Any) -> str:
    """Where ``variable``'s value lives: on one device, replicated or sharded on N (JAX)."""
    sharding = getattr(variable.value, "sharding", None)
    if sharding is None or len(sharding.device_set) == 1:
        return "one device"
    how = "replicated" if sharding.is_fully_replicated else "sharded"
    return f"{how} on {len(sharding.device_set)}"


def recorded(name: str, phase: str, root: str) -> dict[str, Any]:
    """:func:`run_shape`'s results with its CPU seconds, or the error it raised."""
    started = time.process_time()
    try:
        return {**run_shape(name, phase, root), "cpu_s": time.process_time() - started}
    except Exception as exc:  # noqa: BLE001 - recorded per shape; the test reports it
        traceback.print_exc()
        return {"shape": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--phase", choices=("first", "final"), required=True)
    p.add_argument("--shapes", default=None, help="comma-separated (default: this backend's)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    names = args.shapes.split(",") if args.shapes else shapes_here()
    # first: each shape straight, then preempted; final (a new process): each one resumed
    for phase in ("straight", "part") if args.phase == "first" else ("final",):
        out = {name: recorded(name, phase, args.dir) for name in names}
        with open(os.path.join(args.dir, f"{phase}.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
