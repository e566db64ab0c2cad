"""The model-shape corpus: training scripts in the shapes keras-io examples use, run as a user
runs them (``python tests/keras_io/shape_corpus_worker.py``: custom classes live in
``__main__``). No tests in here; ``tests/keras_io/test_shape_corpus.py`` runs it.

    python tests/keras_io/shape_corpus_worker.py --dir D --phase first|final [--shapes a,b]

This script holds the shapes whose classes or functions a training script defines (each shape a
function returning its compiled model, fit arguments, predict input and load arguments);
``shape_corpus_plain.py`` the model shapes of Keras layers only, ``shape_corpus_training.py``
the shapes of how a model is trained (fit() arguments, optimizers, callbacks).
``shape_corpus_runner.py`` runs them all, in this process (``first``: straight and preempted,
``final``: resumed and loaded by UUID).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.isdir(os.path.join(_REPO, "ckptstore")):  # the test runs a copy, with PYTHONPATH
    sys.path.insert(0, _REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.keras_io import shape_corpus_plain as plain  # noqa: E402
from tests.keras_io import shape_corpus_training as training  # noqa: E402
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras  # noqa: E402
from tests.keras_io.shape_corpus_plain import WORDS, compiled, images, numbers  # noqa: E402
from tests.keras_io.shape_corpus_runner import BATCH, N, main  # noqa: E402


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


# ---- shapes: each returns (model, fit args, fit kwargs, predict input, load kwargs) -----------
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


def shape_custom_metric():
    x, y = numbers()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    load = {"custom_objects": {"MeanAbsTarget": MeanAbsTarget}}
    return compiled(model, metrics=[MeanAbsTarget()]), (x, y), {}, x, load


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


# ---- round 3: keras-io shapes with their own training logic, inputs and state -----------------
class Distiller(keras.Model):
    """Knowledge distillation (keras-io): a frozen teacher and a student, ``compile()`` taking
    loss functions, ``alpha`` and ``temperature`` besides the optimizer, its own train and test
    steps; ``call`` is the student's."""

    def __init__(self, student, teacher, **kwargs):
        super().__init__(**kwargs)
        self.student, self.teacher = student, teacher

    def compile(
        self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha, temperature
    ):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn
        self.alpha, self.temperature = alpha, temperature

    def call(self, x):
        return self.student(x)

    def train_step(self, data):
        x, y = data
        soft_teacher = tf.nn.softmax(self.teacher(x, training=False) / self.temperature)
        with tf.GradientTape() as tape:
            pred = self.student(x, training=True)
            student_loss = self.student_loss_fn(y, pred)
            soft = tf.nn.softmax(pred / self.temperature)
            distill = self.distillation_loss_fn(soft_teacher, soft) * self.temperature**2
            loss = self.alpha * student_loss + (1 - self.alpha) * distill
        weights = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
        self.compiled_metrics.update_state(y, pred)
        return {**{m.name: m.result() for m in self.metrics}, "distillation_loss": distill}

    def test_step(self, data):
        x, y = data
        pred = self.student(x, training=False)
        self.compiled_metrics.update_state(y, pred)
        return {
            **{m.name: m.result() for m in self.metrics},
            "student_loss": self.student_loss_fn(y, pred),
        }


def _distiller():
    keras.utils.set_random_seed(17)
    teacher = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(12, activation="relu")] + [keras.layers.Dense(3)],
        name="teacher",
    )
    teacher.trainable = False
    student = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="student")
    distiller = Distiller(student, teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(0.01),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    distiller(np.zeros((1, 4), "float32"))  # built before fit, as a loader needs it
    return distiller


def shape_distiller():
    x, y = numbers()
    fit = {"shuffle": True, "validation_data": (x[:8], y[:8])}  # test_step at each epoch end
    return _distiller(), (x, y), fit, x, {"model": _distiller}


class ColorJitter(_RandomLayer):
    """The SimCLR example's random color transform: a brightness scale and a jitter matrix per
    image, drawn from the layer's own seed state; the identity outside training."""

    def __init__(self, jitter=0.2, **kwargs):
        if KERAS_MAJOR == 3:
            super().__init__(**kwargs)
            self.seed_generator = keras.random.SeedGenerator(1337)
        else:
            super().__init__(seed=1337, **kwargs)
        self.jitter = jitter

    def _uniform(self, shape):
        if KERAS_MAJOR == 3:
            return keras.random.uniform(shape, -self.jitter, self.jitter, seed=self.seed_generator)
        return self._random_generator.random_uniform(shape, -self.jitter, self.jitter)

    def call(self, images, training=True):
        if not training:
            return images
        n = tf.shape(images)[0]
        scale = 1 + self._uniform((n, 1, 1, 1))
        matrices = tf.eye(3, batch_shape=[1, 1]) * scale + self._uniform((n, 1, 3, 3))
        return tf.clip_by_value(tf.matmul(images, matrices), 0.0, 1.0)

    def get_config(self):
        return {**super().get_config(), "jitter": self.jitter}


class SimCLR(keras.Model):
    """Contrastive pretraining (keras-io's SimCLR): no ``call``; each step augments an unlabeled
    and a labeled batch twice, trains encoder + projection head on the NT-Xent loss with one
    optimizer and a linear probe on the frozen features with another. The encoder has no
    ``Input``: it is built by its first call, inside the first step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.augment = keras.Sequential(
            [
                keras.layers.Rescaling(1 / 255),
                keras.layers.RandomFlip("horizontal"),
                ColorJitter(),
            ]
        )
        self.encoder = keras.Sequential(
            [keras.layers.Conv2D(4, 3, strides=2, activation="relu"), keras.layers.Flatten()]
            + [keras.layers.Dense(6, activation="relu")],
            name="encoder",
        )
        self.projection_head = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(6, activation="relu"), keras.layers.Dense(6)]
        )
        self.linear_probe = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])

    def compile(self, contrastive_optimizer, probe_optimizer, **kwargs):
        super().compile(**kwargs)
        self.contrastive_optimizer, self.probe_optimizer = contrastive_optimizer, probe_optimizer
        self.probe_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.c_loss, self.p_loss = (keras.metrics.Mean(name=n) for n in ("c_loss", "p_loss"))

    @property
    def metrics(self):
        return [self.c_loss, self.p_loss]

    def contrastive_loss(self, a, b):
        a, b = tf.math.l2_normalize(a, axis=1), tf.math.l2_normalize(b, axis=1)
        similarities = tf.matmul(a, b, transpose_b=True) / 0.1
        labels = tf.range(tf.shape(a)[0])
        ce = keras.losses.sparse_categorical_crossentropy
        one = ce(labels, similarities, from_logits=True)
        return tf.reduce_mean(one + ce(labels, tf.transpose(similarities), from_logits=True)) / 2

    def train_step(self, data):
        (unlabeled, _), (labeled, labels) = data
        images = tf.concat([unlabeled, labeled], axis=0)
        views = [self.augment(images, training=True) for _ in range(2)]
        with tf.GradientTape() as tape:
            projections = [self.projection_head(self.encoder(v, training=True)) for v in views]
            c_loss = self.contrastive_loss(*projections)
        weights = self.encoder.trainable_weights + self.projection_head.trainable_weights
        grads = tape.gradient(c_loss, weights)
        self.contrastive_optimizer.apply_gradients(zip(grads, weights, strict=True))
        with tf.GradientTape() as tape:
            features = self.encoder(self.augment(labeled, training=True), training=False)
            p_loss = self.probe_loss(labels, self.linear_probe(features, training=True))
        weights = self.linear_probe.trainable_weights
        self.probe_optimizer.apply_gradients(
            zip(tape.gradient(p_loss, weights), weights, strict=True)
        )
        self.c_loss.update_state(c_loss)
        self.p_loss.update_state(p_loss)
        return {m.name: m.result() for m in self.metrics}


def _simclr(build=False):
    keras.utils.set_random_seed(19)
    model = SimCLR()
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    if build:  # a loader's model: built by calling its parts (the training run builds in fit)
        images = model.augment(np.zeros((1, 8, 8, 3), "float32"), training=False)
        model.linear_probe(model.encoder(images))
    return model


def _probe(model, sample):
    """SimCLR has no ``call``: compare the linear probe's predictions on the encoder's features."""
    return np.asarray(model.linear_probe(model.encoder(sample / 255.0)))


def shape_simclr():
    x, y = images()
    unlabeled = tf.data.Dataset.from_tensor_slices((x[::-1], y)).shuffle(N, seed=7).batch(BATCH)
    labeled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=8).batch(BATCH)
    objects = {"SimCLR": SimCLR, "ColorJitter": ColorJitter}
    load = {"model": lambda: _simclr(build=True), "custom_objects": objects, "predict": _probe}
    return _simclr(), (tf.data.Dataset.zip((unlabeled, labeled)),), {}, x, load


def euclidean_distance(vectors):
    a, b = vectors
    squares = tf.reduce_sum(tf.square(a - b), axis=1, keepdims=True)
    return tf.sqrt(tf.maximum(squares, keras.backend.epsilon()))


def contrastive(margin=1.0):
    def contrastive_loss(y_true, y_pred):
        far = tf.square(tf.maximum(margin - y_pred, 0))
        return tf.reduce_mean((1 - y_true) * tf.square(y_pred) + y_true * far)

    return contrastive_loss


def shape_siamese():
    """keras-io's siamese network: one embedding network applied to both inputs, a ``Lambda``
    of the script's distance function, a loss closure, an optimizer by name, a list of inputs."""
    x, y = numbers()
    pairs = [x, x[::-1] * 0.5]
    same = (y == y[::-1]).astype("float32")
    inp = keras.Input((4,))
    h = keras.layers.Dense(4, activation="tanh")(keras.layers.BatchNormalization()(inp))
    embedding = keras.Model(inp, h)
    a, b = keras.Input((4,)), keras.Input((4,))
    distance = keras.layers.Lambda(euclidean_distance)([embedding(a), embedding(b)])
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.BatchNormalization()(distance))
    model = keras.Model([a, b], out)
    model.compile(loss=contrastive(margin=1.0), optimizer="RMSprop", metrics=["accuracy"])
    load = {
        "custom_objects": {
            "euclidean_distance": euclidean_distance,
            "contrastive_loss": contrastive(),
        },
        "safe_mode": False,
    }
    return model, (pairs, same), {"shuffle": True}, pairs, load


class CountingModel(keras.Model):
    """A functional model keeping its own non-trainable counter of the examples it trained on,
    updated in its ``train_step``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        variable = keras.Variable if KERAS_MAJOR == 3 else tf.Variable
        self.seen = variable(0.0, trainable=False, name="seen")

    def train_step(self, data):
        self.seen.assign_add(tf.cast(tf.shape(data[0])[0], "float32"))
        return super().train_step(data)


def _counting():
    inp = keras.Input((4,))
    out = keras.layers.Dense(3, activation="sigmoid")(keras.layers.Dense(6, activation="relu")(inp))
    model = CountingModel(inp, out)
    metrics = [keras.metrics.F1Score(average="micro", threshold=0.5)]
    model.compile(
        keras.optimizers.Adam(0.01),
        loss="binary_crossentropy",
        metrics=metrics + [keras.metrics.AUC(multi_label=True, num_labels=3)],
    )
    return model


def shape_multilabel_counter():
    """Multi-label (sigmoid outputs, multi-hot targets) with ``F1Score`` and ``AUC``, in a
    functional model subclass counting its examples in a non-trainable variable (Keras 2
    saves a config its ``__init__(*args, **kwargs)`` cannot be rebuilt from: ``model=``)."""
    x, _ = numbers()
    y = (x[:, :3] > 0.5).astype("float32")
    load = {"custom_objects": {"CountingModel": CountingModel}}
    if KERAS_MAJOR == 2:
        load["model"] = _counting
    return _counting(), (x, y), {"shuffle": True}, x, load


SHAPES = {
    **{n.removeprefix("shape_"): fn for n, fn in dict(globals()).items() if n.startswith("shape_")},
    **plain.SHAPES,  # Keras layers only, from shape_corpus_plain.py
    **training.SHAPES,  # how a model is trained: shape_corpus_training.py
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


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
