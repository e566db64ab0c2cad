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
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

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


class Sigterm(keras.callbacks.Callback):
    """SIGTERM to this process right after batch ``step`` of this run (first in the list)."""

    def __init__(self, step):
        super().__init__()
        self.step, self.steps_here = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps_here += 1
        if self.step is not None and self.steps_here == self.step:  # the part run starts at 0
            os.kill(os.getpid(), signal.SIGTERM)


def run_shape(name: str, phase: str, root: str) -> dict:
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
        model.fit(*args, epochs=EPOCHS, verbose=0, callbacks=[sigterm, cb], **_batch(args, kwargs))
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
