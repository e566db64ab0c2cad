"""The model-shape corpus: training scripts in the shapes keras-io examples use, run as a user
runs them (``python tests/keras_io/shape_corpus_worker.py``: custom classes live in
``__main__``). No tests in here; ``tests/keras_io/test_shape_corpus.py`` runs it.

    python tests/keras_io/shape_corpus_worker.py --dir D --phase straight|part|final [--shapes a,b]

Each phase runs every shape in turn in this one process (each with its own storage, registry
and seed; the shapes are built in the same order in every phase, so layer names agree):
``straight`` trains 2 epochs of 4 steps with ``DeterminedCallback``; ``part`` does the same
and sends itself SIGTERM after step ``SIGTERM_AT`` (inside epoch 2); ``final`` resumes from the
latest checkpoint, finishes, loads the last checkpoint by UUID and compares its predictions.
Writes ``D/<phase>.json`` (per shape: steps, resumed, missing artifacts, load result, errors)
and ``D/<phase>-<shape>.npz`` (model and optimizer variables).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.isdir(os.path.join(_REPO, "ckptstore")):  # the test runs a copy, with PYTHONPATH
    sys.path.insert(0, _REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ckptstore as det  # noqa: E402
from tests.keras_io.keras_under_test import (  # noqa: E402
    KERAS_MAJOR,
    keras,
    optimizer_variables,
)

BATCH = 4
STEPS = 4  # per epoch
EPOCHS = 2
N = BATCH * STEPS
SIGTERM_AT = 6  # inside epoch 2
WORDS = np.array(["red", "green", "blue", "cyan", "grey"])


# ---- custom classes of the training script (__main__), as keras-io examples define them ----
class Classifier(keras.layers.Layer):
    """A head layer with a get_config (the keras-io pattern)."""

    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        self.classes = classes
        self.dense = keras.layers.Dense(classes)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        return {**super().get_config(), "classes": self.classes}


class Scaled(keras.layers.Layer):
    """Takes a Python object in __init__ and has no get_config: not serializable."""

    def __init__(self, scale_source, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(next(iter(scale_source)))
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x) * self.factor


class MeanAbsTarget(keras.metrics.Metric):
    """A custom keras.metrics metric with its own state variables."""

    def __init__(self, name="mean_abs_target", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_weight(name="total", initializer="zeros")
        self.count = self.add_weight(name="count", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = tf.cast(y_true, self.dtype)
        self.total.assign_add(tf.reduce_sum(tf.abs(y_true)))
        self.count.assign_add(tf.cast(tf.size(y_true), self.dtype))

    def result(self):
        return self.total / tf.maximum(self.count, 1.0)


# ---- data -------------------------------------------------------------------------------------
def numbers(features=4, classes=3):
    rng = np.random.RandomState(0)
    x = rng.rand(N, features).astype("float32")
    y = (x.sum(axis=1) * 2.3).astype("int64") % classes
    return x, y


def compiled(model, **kwargs):
    model.compile(
        keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **kwargs,
    )
    return model


# ---- shapes: each returns (model, fit args, fit kwargs, predict input, load kwargs) -----------
def shape_sequential():
    x, y = numbers()
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    return compiled(model, metrics=["accuracy"]), (x, y), {"shuffle": True}, x, {}


def shape_functional_dict():
    x, y = numbers(3)
    words = WORDS[np.arange(N) % len(WORDS)].reshape(-1, 1)
    lookup = keras.layers.StringLookup(output_mode="multi_hot")
    lookup.adapt(words)
    norm = keras.layers.Normalization()
    norm.adapt(x)
    num_in = keras.Input((3,), name="num")
    word_in = keras.Input((1,), dtype="string", name="word")
    h = keras.layers.Concatenate()([norm(num_in), lookup(word_in)])
    out = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(h))
    model = compiled(keras.Model({"num": num_in, "word": word_in}, out))
    inputs = {"num": x, "word": words}
    ds = tf.data.Dataset.from_tensor_slices((inputs, y)).shuffle(N, seed=2).batch(BATCH)
    return model, (ds,), {}, inputs, {}


def shape_custom_layer_main():
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), Classifier(3)])
    return compiled(model), (x, y), {}, x, {"custom_objects": {"Classifier": Classifier}}


def _scaled_model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((4,)), Scaled(v for v in [0.5])])
    return compiled(model)


def shape_custom_layer_no_config():
    x, y = numbers()
    return _scaled_model(), (x, y), {}, x, {"model": _scaled_model}


def shape_nested():
    x, y = numbers()
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu")])
    inp = keras.Input((4,))
    model = compiled(keras.Model(inp, keras.layers.Dense(3)(inner(inp))))
    return model, (x, y), {}, x, {}


def shape_batchnorm():
    x, y = numbers()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization()]
        + [keras.layers.Dense(3)]
    )
    return compiled(model), (x, y), {"shuffle": True}, x, {}


def shape_sample_weight():
    x, y = numbers()
    w = np.linspace(0.5, 1.5, N).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (x, y), {"sample_weight": w}, x, {}


def shape_class_weight():
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (x, y), {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}}, x, {}


def shape_custom_metric():
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    load = {"custom_objects": {"MeanAbsTarget": MeanAbsTarget}}
    return compiled(model, metrics=[MeanAbsTarget()]), (x, y), {}, x, load


def shape_stateful_rnn():
    rng = np.random.RandomState(1)
    x = rng.rand(N, 5, 2).astype("float32")
    y = (x.sum(axis=(1, 2)) * 3).astype("int64") % 3
    model = keras.Sequential(
        [keras.Input(batch_shape=(BATCH, 5, 2)), keras.layers.LSTM(4, stateful=True)]
        + [keras.layers.Dense(3)]
    )
    return compiled(model), (x, y), {"shuffle": False}, x, {}


def shape_mixed_precision():
    x, y = numbers()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(3, dtype="float32"),
            ]
        )
        model = compiled(model)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, (x, y), {}, x, {}


def shape_endless_generator():
    x, y = numbers()

    def batches():
        while True:  # one pass per epoch: steps_per_epoch == STEPS
            for i in range(0, N, BATCH):
                yield x[i : i + BATCH], y[i : i + BATCH]

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    return compiled(model), (batches(),), {"steps_per_epoch": STEPS}, x, {}


class GAN(keras.Model):
    """A subclassed model with its own train_step and two optimizers, trained on input-only
    batches (the keras-io DCGAN's shape; the latent batch comes from the data, no RNG)."""

    def __init__(self, discriminator, generator, latent_dim, **kwargs):
        super().__init__(**kwargs)
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, z):
        return self.generator(z)

    def train_step(self, real):
        z = tf.matmul(real, tf.ones((real.shape[-1], self.latent_dim)) / 7.0)
        fake = self.generator(z)
        both = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((tf.shape(real)[0], 1)), tf.zeros((tf.shape(real)[0], 1))], 0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(both))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights, strict=True))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(
                tf.zeros((tf.shape(real)[0], 1)), self.discriminator(self.generator(z))
            )
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights, strict=True))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def _gan():
    keras.utils.set_random_seed(11)
    disc = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(1)])
    gen = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
    gan = GAN(disc, gen, latent_dim=2)
    gan.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    gan(np.zeros((1, 2), "float32"))  # built before fit, as a loader needs it
    return gan


def shape_gan_two_optimizers():
    x, _ = numbers()
    ds = tf.data.Dataset.from_tensor_slices(x).shuffle(N, seed=4).batch(BATCH)
    z = np.linspace(-1, 1, 2 * N, dtype="float32").reshape(N, 2)
    return _gan(), (ds,), {}, z, {"model": _gan}


# ---- shapes of keras-io examples the shapes above do not cover --------------------------------
def images(size=8):
    rng = np.random.RandomState(2)
    x = (rng.rand(N, size, size, 3) * 255).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) / 8).astype("int64") % 3
    return x, y


def shape_augmentation_layers():
    """Image classification from scratch: random augmentation layers inside the model (each
    draws from its own seed state in training, and is the identity in predict)."""
    x, y = images()
    augment = keras.Sequential(
        [
            keras.layers.RandomFlip("horizontal"),
            keras.layers.RandomRotation(0.1),
            keras.layers.RandomZoom(0.1),
        ]
    )
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Rescaling(1.0 / 255)(augment(inp))
    h = keras.layers.Conv2D(4, 3, activation="relu")(h)
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))
    return compiled(keras.Model(inp, out)), (x, y), {"shuffle": True}, x, {}


def shape_gradient_accumulation():
    """``gradient_accumulation_steps=4``: SIGTERM after step 6 lands between two updates, with
    2 gradients in the accumulators (optimizer variables)."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    model.compile(
        keras.optimizers.Adam(0.01, gradient_accumulation_steps=4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, (x, y), {"shuffle": True}, x, {}


def shape_steps_per_execution():
    """``compile(steps_per_execution=2)``: callbacks see every 2nd batch."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    return compiled(model, steps_per_execution=2), (x, y), {"shuffle": True}, x, {}


class TokenAndPosition(keras.layers.Layer):
    """Token embedding plus a learned position embedding (the keras-io text transformer's)."""

    def __init__(self, length, vocabulary, width, **kwargs):
        super().__init__(**kwargs)
        self.length, self.vocabulary, self.width = length, vocabulary, width
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, ids):
        return self.tokens(ids) + self.positions(tf.range(self.length))

    def get_config(self):
        extra = {"length": self.length, "vocabulary": self.vocabulary, "width": self.width}
        return {**super().get_config(), **extra}


class Encoder(keras.layers.Layer):
    """Self-attention and a feed-forward part, each with dropout, residual and layer norm."""

    def __init__(self, width, heads, hidden, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.width, self.heads, self.hidden, self.rate = width, heads, hidden, rate
        self.attention = keras.layers.MultiHeadAttention(heads, width)
        self.feed = keras.Sequential(
            [keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(width)]
        )
        self.norms = [keras.layers.LayerNormalization(epsilon=1e-6) for _ in range(2)]
        self.drops = [keras.layers.Dropout(rate) for _ in range(2)]

    def call(self, h, training=None):
        h = self.norms[0](h + self.drops[0](self.attention(h, h), training=training))
        return self.norms[1](h + self.drops[1](self.feed(h), training=training))

    def get_config(self):
        extra = {"width": self.width, "heads": self.heads, "hidden": self.hidden}
        return {**super().get_config(), **extra, "rate": self.rate}


def shape_text_transformer():
    """Text classification with a transformer: an adapted ``TextVectorization`` in the model,
    token + position embeddings, a multi-head attention block, shuffled ``tf.data``."""
    texts = np.array(
        [" ".join(WORDS[(i * k + k) % len(WORDS)] for k in (1, 2, 3)) for i in range(N)]
    )
    labels = (np.arange(N) % 3 == 0).astype("int64")
    vectorize = keras.layers.TextVectorization(max_tokens=8, output_sequence_length=4)
    vectorize.adapt(texts)
    inp = keras.Input((1,), dtype="string")
    ids = vectorize(keras.layers.Reshape(())(inp) if KERAS_MAJOR == 3 else inp)
    h = Encoder(4, 2, 8)(TokenAndPosition(4, 8, 4)(ids))
    h = keras.layers.Dropout(0.1)(keras.layers.GlobalAveragePooling1D()(h))
    model = compiled(keras.Model(inp, keras.layers.Dense(2)(h)))
    texts = texts.reshape(-1, 1)
    ds = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(N, seed=5).batch(BATCH)
    sample = tf.data.Dataset.from_tensor_slices(texts).batch(BATCH)
    load = {"custom_objects": {"TokenAndPosition": TokenAndPosition, "Encoder": Encoder}}
    return model, (ds,), {}, sample, load


def shape_lr_schedule_ema():
    """A ``LearningRateSchedule`` object as the learning rate, and ``use_ema=True``."""
    x, y = numbers()
    decay = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=3, decay_rate=0.5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    model.compile(
        keras.optimizers.Adam(decay, use_ema=True, ema_momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, (x, y), {"shuffle": True}, x, {}


def halve_after_first(epoch, lr):
    """A LearningRateScheduler schedule of the keras docs' kind: from the current rate."""
    return lr if epoch < 1 else lr * 0.5


def shape_lr_scheduler_callback():
    """``LearningRateScheduler`` changing the rate (from its current value) at epoch begin."""
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), keras.layers.Dense(3)])
    schedule = keras.callbacks.LearningRateScheduler(halve_after_first)
    return compiled(model), (x, y), {"shuffle": True, "callbacks": [schedule]}, x, {}


class PenalizedOutputs(keras.Model):
    """A functional model overriding ``compute_loss`` (adds an output penalty)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, **kwargs)
        return loss + 0.01 * tf.reduce_mean(tf.square(y_pred))


def shape_compute_loss_override():
    x, y = numbers()
    inp = keras.Input((4,))
    out = keras.layers.Dense(3)(keras.layers.Dense(6, activation="relu")(inp))
    model = compiled(PenalizedOutputs(inp, out))
    load = {"custom_objects": {"PenalizedOutputs": PenalizedOutputs}}
    return model, (x, y), {"shuffle": True}, x, load


_RandomLayer = keras.layers.Layer if KERAS_MAJOR == 3 else keras.__internal__.layers.BaseRandomLayer


class Sampling(_RandomLayer):
    """z = mean + exp(log_var / 2) * noise, the noise from the layer's own seed state."""

    def __init__(self, **kwargs):
        if KERAS_MAJOR == 3:
            super().__init__(**kwargs)
            self.seed_generator = keras.random.SeedGenerator(1337)
        else:
            super().__init__(seed=1337, **kwargs)

    def call(self, inputs):
        mean, log_var = inputs
        if KERAS_MAJOR == 3:
            noise = keras.random.normal(tf.shape(mean), seed=self.seed_generator)
        else:
            noise = self._random_generator.random_normal(tf.shape(mean))
        return mean + tf.exp(0.5 * log_var) * noise


class VAE(keras.Model):
    """The keras-io VAE's shape: encoder and decoder sub-models, its own ``train_step`` and
    three ``keras.metrics.Mean`` trackers; ``call`` decodes the mean (no sampling)."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_tracker = keras.metrics.Mean(name="total_loss")
        self.rebuild_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_tracker, self.rebuild_tracker, self.kl_tracker]

    def call(self, x):
        return self.decoder(self.encoder(x)[0])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            mean, log_var, z = self.encoder(data, training=True)
            rebuilt = self.decoder(z, training=True)
            rebuild = tf.reduce_mean(tf.reduce_sum(tf.square(data - rebuilt), axis=1))
            kl = -0.5 * (1 + log_var - tf.square(mean) - tf.exp(log_var))
            kl = tf.reduce_mean(tf.reduce_sum(kl, axis=1))
            total = rebuild + kl
        weights = self.trainable_weights
        self.optimizer.apply_gradients(zip(tape.gradient(total, weights), weights, strict=True))
        for tracker, value in zip(self.metrics, (total, rebuild, kl), strict=True):
            tracker.update_state(value)
        return {m.name: m.result() for m in self.metrics}


def _vae():
    keras.utils.set_random_seed(13)
    inp = keras.Input((4,))
    h = keras.layers.Dense(4, activation="relu")(inp)
    mean, log_var = keras.layers.Dense(2)(h), keras.layers.Dense(2)(h)
    encoder = keras.Model(inp, [mean, log_var, Sampling()([mean, log_var])])
    latent = keras.Input((2,))
    decoder = keras.Model(latent, keras.layers.Dense(4, activation="sigmoid")(latent))
    vae = VAE(encoder, decoder)
    vae.compile(keras.optimizers.Adam(0.01))
    vae(np.zeros((1, 4), "float32"))  # built before fit, as a loader needs it
    return vae


def shape_vae_metric_trackers():
    x, _ = numbers()
    ds = tf.data.Dataset.from_tensor_slices(x).shuffle(N, seed=6).batch(BATCH)
    return _vae(), (ds,), {}, x, {"model": _vae}


SHAPES = {
    name.removeprefix("shape_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("shape_")
}
#: Shapes whose resumed run's final checkpoint gets a SavedModel (the others export "never", to
#: keep the corpus fast): classes from __main__ (exported in-process), no config, and a
#: stateful RNN whose fixed batch size fails the export's check (the checkpoint commits anyway).
EXPORT_SHAPES = {"custom_layer_main", "custom_layer_no_config", "stateful_rnn", "sequential"}
#: Where SIGTERM lands for a shape whose mid-epoch position cannot be resumed (a generator):
#: the end of epoch 1, so the resumed run starts a whole epoch (the documented behaviour).
SIGTERM_AT_EPOCH_END = {"endless_generator"}
#: Shapes Keras 2 cannot express, with why (the Keras 2 column of the table says so).
KERAS3_ONLY = {
    "gradient_accumulation": "Keras 2's optimizers have no `gradient_accumulation_steps`"
}


class Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process right after batch ``step`` of this run (first in the list)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.steps_here, self.begin = step, 0, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self.steps_here += batch - self.begin + 1  # steps_per_execution=k: k batches a call
        if self.step is not None and self.steps_here == self.step:  # the part run starts at 0
            os.kill(os.getpid(), signal.SIGTERM)


def run_shape(name: str, phase: str, root: str) -> dict:
    cpu = time.process_time()
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    storage = os.path.join(folder, "ckpts")
    registry = f"sqlite:///{os.path.join(folder, 'registry.db')}"
    if phase == "straight":
        storage += "-straight"
        registry = registry.replace("registry.db", "straight.db")
    keras.backend.clear_session()  # the same layer (and RNG state) names in every process
    if KERAS_MAJOR == 2:
        keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(3)
    model, args, kwargs, sample, load = SHAPES[name]()
    kwargs = dict(kwargs)
    extra_callbacks = kwargs.pop("callbacks", [])
    step = None
    if phase == "part":
        step = STEPS if name in SIGTERM_AT_EPOCH_END else SIGTERM_AT
    sigterm = Sigterm(step)
    out: dict = {"shape": name}
    with det.core.init(storage=storage, registry=registry, trial_id=1) as core:
        # the export (worker process or in-process) is part of the resumed run's final save
        export = "final" if phase == "final" and name in EXPORT_SHAPES else "never"
        cb = det.keras.DeterminedCallback(
            core, core.info.latest_checkpoint, continue_id=1, export_saved_model=export
        )
        model.fit(
            *args,
            epochs=EPOCHS,
            verbose=0,
            callbacks=[sigterm, *extra_callbacks, cb],
            **_batch(args, kwargs),
        )
        out.update(preempted=bool(core.preempt.acknowledged), resumed=cb.resumed)
    last = cb.last_checkpoint
    stepped = getattr(model, "d_optimizer", model.optimizer)  # a GAN steps its own optimizers
    out.update(steps_here=sigterm.steps_here, iterations=int(stepped.iterations.numpy()))
    # by position: the straight and preempted runs share a process, so layer names differ
    variables = [v for v in model.variables if hasattr(v, "numpy")]  # not Keras 2's handlers
    arrays = {f"model/{i:03d}": v.numpy() for i, v in enumerate(variables)}
    opt = optimizer_variables(model)
    for extra in ("d_optimizer", "g_optimizer"):  # the GAN's own optimizers
        if hasattr(model, extra):
            found = getattr(model, extra).variables
            opt = opt + list(found() if callable(found) else found)
    arrays.update({f"opt/{i:03d}": v.numpy() for i, v in enumerate(opt)})
    np.savez(os.path.join(root, f"{phase}-{name}.npz"), **arrays)
    meta = {}
    if last:
        with open(os.path.join(storage, last, "metadata.json")) as f:
            meta = json.load(f)
    out.update(missing=meta.get("missing", {}), saved_model=meta.get("saved_model"))
    if phase == "final":
        out["load"] = _load_and_compare(model, last, storage, registry, sample, load)
    out["cpu_seconds"] = round(time.process_time() - cpu, 2)  # what a shape costs CI
    return out


def _batch(args, kwargs):
    """``batch_size`` for array inputs (a dataset or generator batches itself)."""
    if isinstance(args[0], (np.ndarray, dict)):
        return {"batch_size": BATCH, **kwargs}
    return kwargs


def _load_and_compare(model, uuid, storage, registry, sample, load) -> dict:
    """Load checkpoint ``uuid`` by UUID (as the shape says) and compare predictions."""
    result: dict = {}
    if "model" in load:  # weights-only: say so without model=, load with it
        try:
            det.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=registry)
        except Exception as exc:  # noqa: BLE001 - the cell says what happened
            result["without_model"] = (
                "ModelLoadError names model=" if "model=" in str(exc) else str(exc)
            )
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=storage, registry=registry, **load
    )
    if isinstance(sample, dict):  # string arrays go in as a dataset (Keras 3 refuses '<U5')
        sample = tf.data.Dataset.from_tensor_slices(sample).batch(BATCH)
    want, got = (_predict(m, sample) for m in (model, loaded))
    result["predict_equal"] = bool(np.array_equal(want, got))
    return result


def _predict(model, sample):
    """Predictions from a fresh state: a stateful RNN starts from zero states."""
    for layer in model.layers:
        if getattr(layer, "stateful", False):
            layer.reset_states() if hasattr(layer, "reset_states") else layer.reset_state()
    batch = None if isinstance(sample, tf.data.Dataset) else BATCH
    return np.asarray(model.predict(sample, batch_size=batch, verbose=0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--phase", choices=("first", "final"), required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tf.config.experimental.enable_op_determinism()
    results = {}
    # first: the straight run and the preempted one of each shape; final (a new process, as
    # after a real preemption): the resumed run, the load by UUID
    phases = ("straight", "part") if args.phase == "first" else ("final",)
    for phase in phases:
        results = {}
        for name in args.shapes.split(","):
            if KERAS_MAJOR == 2 and name in KERAS3_ONLY:
                results[name] = {"shape": name, "keras3_only": KERAS3_ONLY[name]}
                continue
            try:
                results[name] = run_shape(name, phase, args.dir)
            except Exception as exc:  # noqa: BLE001 - recorded per shape; the test reports it
                traceback.print_exc()
                results[name] = {"shape": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        with open(os.path.join(args.dir, f"{phase}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
