"""Training scripts written for JAX and PyTorch in keras-io's shapes (``backend_shapes_worker.py``):
each trains with ``DeterminedCallback``, is preempted by a real SIGTERM inside epoch 2, resumes in
a new process bit-equal to a run never stopped (weights, optimizer slots, the metric trackers'
epoch logs), and loads by UUID with the trained model's predictions.

On JAX: a ``train_step`` in JAX's stateless style (``stateless_call``, ``stateless_apply``, its
own trackers' stateless updates, returning ``(logs, state)``), ``keras.distribution``'s
``DataParallel`` (replicated arrays) and ``ModelParallel`` (a sharded kernel) on two host CPU
devices (``XLA_FLAGS``), loaded there and on one device; on PyTorch: a ``train_step`` with
``zero_grad()``/``backward()``/``optimizer.apply()`` and keras-io's GAN drawing from its own
``SeedGenerator``; on both: augmentation layers in the model (their ``SeedGenerator`` states),
``gradient_accumulation_steps`` (SIGTERM between two updates), and augmentation layers mapped
over a ``tf.data`` pipeline, which TensorFlow cannot checkpoint: that run goes on, its epoch
restarts on resume (one warning says so and names the fix). On JAX also
``compile(steps_per_execution=2)`` over a tf.data epoch of 3 batches, executions of 2 and 1
(PyTorch's Keras refuses ``steps_per_execution`` > 1).

On both, keras-io's backend-agnostic scripts as users run them on JAX or PyTorch: tf.data
pipelines (shuffled with a seed, stateless augmentation in a parallel ``map()``, ``cache()``,
``prefetch()``; one pass an epoch, and ``repeat()`` with ``steps_per_epoch``), ``TextVectorization``
mapped over a string dataset into an ``Embedding`` model, a ``PyDataset`` (``workers=1``) that
reorders itself in ``on_epoch_end`` with ``get_state``/``load_state``, a seeded generator with
``steps_per_epoch``, a layer, a metric and a loss function of the script with
``BatchNormalization`` and ``Dropout``, and ``ModelCheckpoint`` + ``ReduceLROnPlateau`` +
``EarlyStopping(restore_best_weights=True)`` beside ``DeterminedCallback``; and where users of
JAX and PyTorch go next: a ``keras.ops`` layer whose ``build()`` makes its weights from the first
batch (a ``Sequential`` without ``Input``) validated on a ``PyDataset``, ``Embedding`` +
``GlobalAveragePooling1D`` on integer sequences from a generator, the ``mixed_float16`` policy
(a ``LossScaleOptimizer``), and on JAX ``jit_compile=False``.

Runs in the JAX and PyTorch child runs (``test_jax_suite.py``, ``test_torch_suite.py``): two
worker processes each. The last two tests here run on every backend, TensorFlow included: a
``tf.data`` pipeline holding state outside it, and a VAE whose sampling layer draws from its own
``SeedGenerator``, loaded by UUID as ``keras.saving.load_model`` loads it (the initial seed
state: Keras saves none).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import ckptstore as det
from ckptstore.checkpointing import format as fmt
from tests._helpers.jax_env import REPO, keras_env
from tests.keras_io.test_shape_corpus import bit_equal, load

pytestmark = pytest.mark.e2e  # trains Keras models end to end

HERE = keras.backend.backend()
WORKER = os.path.join(REPO, "tests", "keras_io", "backend_shapes_worker.py")
#: Random draws in their input pipeline stay out of its checkpoint: the resumed run continues
#: at the next batch with other draws, so it is not bit-equal (keras_io/data/_tfdata_state.py).
OTHER_DRAWS = {"augmentation_in_tf_data"}
#: Where the first kernel of each distributed shape lives, trained and loaded in its scope.
DISTRIBUTED = {"jax_data_parallel": "replicated on 2", "jax_model_parallel": "sharded on 2"}
#: How the train step's input batch is split (ModelParallel's batch axis has one device).
BATCH_SPLIT = {"jax_data_parallel": "batch", "jax_model_parallel": "replicated"}
WARNED = "The tf.data pipeline of this fit() draws random numbers outside it"
#: Batch-end calls of the preempted run and of the resumed one (default: batches 6, then 2).
CALLS = {
    "jax_steps_per_execution": (3, 1),  # executions of 2 and 1 batches, 3 an epoch
    "tfdata_cache_repeat_steps": (6, 4),  # steps_per_epoch=5
    "generator_steps_per_epoch": (4, 2),  # steps_per_epoch=3
    "keras_callbacks": (10, 2),  # SIGTERM in epoch 3, EarlyStopping stops after it
}
#: keras-io's backend-agnostic scripts, on both backends
KERAS_IO = {
    "tfdata_stateless_augment",
    "tfdata_cache_repeat_steps",
    "text_vectorization_tfdata",
    "pydataset_workers_1",
    "generator_steps_per_epoch",
    "script_objects",
    "keras_callbacks",
    "ops_layer_lazy_build",
    "embedding_pooling_generator",
    "mixed_float16",
}
ON_BOTH = {"augmentation", "gradient_accumulation", "augmentation_in_tf_data"} | KERAS_IO


def run_phase(workdir, phase: str) -> str:
    """Runs the worker's ``phase`` on this backend with two host devices; its stderr."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = keras_env(HERE, TF_CPP_MIN_LOG_LEVEL="2", XLA_FLAGS=flags.strip())
    argv = [sys.executable, WORKER, "--dir", str(workdir), "--phase", phase]
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stderr


def _backend_shapes_resume_bit_exactly_and_load(tmp_path):
    first = run_phase(tmp_path, "first")
    last = run_phase(tmp_path, "final")
    straight, part, final = (load(tmp_path, p) for p in ("straight", "part", "final"))
    want = {
        "jax": {
            "jax_stateless_train_step",
            "jax_data_parallel",
            "jax_model_parallel",
            "jax_steps_per_execution",
            "jax_no_jit",
        },
        "torch": {"torch_train_step", "torch_gan_seed_generator"},
    }[HERE] | ON_BOTH
    assert set(final) == want
    for shape in sorted(want):
        for phase in (straight, part, final):
            assert "error" not in phase[shape], (shape, phase[shape].get("error"))
        calls_part, calls_left = CALLS.get(shape, (6, 2))
        assert part[shape]["preempted"] and part[shape]["steps_here"] == calls_part, shape
        assert final[shape]["resumed"] and final[shape]["load"]["predict_equal"], shape
        assert final[shape]["steps_here"] == calls_left, shape  # what the first run left
        if shape in OTHER_DRAWS:
            continue
        assert bit_equal(tmp_path, shape), f"{shape}: resumed run differs from the straight one"
        assert final[shape]["logs"] == straight[shape]["logs"], shape  # trackers' epoch state
        assert final[shape]["iterations"] == straight[shape]["iterations"], shape
    if HERE == "jax":  # its own test_step on validation data, bit-equal too
        assert "val_loss" in final["jax_stateless_train_step"]["logs"][0]
        # an execution cut short by the epoch's end, not run on into the next epoch's batches
        assert straight["jax_steps_per_execution"]["iterations"] == [6]
    # gradient accumulation: one update per 4 steps; SIGTERM came with 2 steps accumulated
    assert [
        part["gradient_accumulation"]["iterations"],
        final["gradient_accumulation"]["iterations"],
    ] == [[1], [2]]
    for shape, layout in DISTRIBUTED.items() if HERE == "jax" else ():
        # kept by the snapshot's copies (epoch-1 checkpoint) and by the resume's load
        layouts = [phase[shape]["epoch2_layout"] for phase in (straight, part, final)]
        assert layouts == [layout] * 3, (shape, layouts)
        # each batch split between the devices as Keras's own loop splits it
        specs = [phase[shape]["batch_specs"] for phase in (straight, part, final)]
        assert specs == [[BATCH_SPLIT[shape]]] * 3, (shape, specs)
        assert final[shape]["layout"] == final[shape]["load"]["layout"] == layout, shape
        on_one = final[shape]["load_on_one_device"]
        assert on_one["layout"] == "one device" and on_one["max_diff"] < 1e-5, (shape, on_one)
    # EarlyStopping stopped after epoch 3 of 4 and ReduceLROnPlateau halved the rate twice,
    # once before the SIGTERM and once in the resumed run (both bit-equal to the straight run)
    for phase in (straight, final):
        assert phase["keras_callbacks"]["iterations"] == [12]
        assert phase["keras_callbacks"]["learning_rate"] == pytest.approx(0.05 / 4)
    assert "val_true_p" in final["script_objects"]["logs"][0]  # the script's own metric
    assert "val_loss" in final["ops_layer_lazy_build"]["logs"][0]  # a PyDataset every epoch
    if HERE == "jax":
        assert "val_loss" in final["jax_no_jit"]["logs"][0]
    # compile() wrapped Adam in a LossScaleOptimizer: its dynamic scale came back on resume
    assert final["mixed_float16"]["optimizer"] == "LossScaleOptimizer"
    assert "has no get_state()" not in first + last  # the PyDataset carries its order
    # the draws left out were named once per fit() (straight, part, then final)
    assert (first.count(WARNED), last.count(WARNED)) == (2, 1)
    assert "in the model instead of in dataset.map()" in last


# Defined on JAX and PyTorch only (a skip fails under CI=true): their child runs run it.
if HERE in ("jax", "torch"):
    test_backend_shapes_resume_bit_exactly_and_load = _backend_shapes_resume_bit_exactly_and_load


@pytest.mark.parametrize("outside", ["draws", "python"])
def test_a_pipeline_holding_state_outside_it_leaves_fit_running(where, caplog, outside):
    """A tf.data pipeline whose state TensorFlow will not checkpoint used to fail fit() at its
    first checkpoint (``FailedPreconditionError: ... is stateful``). Random draws (a Keras
    augmentation layer in ``map()``): the checkpoints keep the data position and the resumed
    run continues at the next batch. A Python function (``tf.py_function``): its state may be
    the data's, so the checkpoints commit without the position. One warning per fit() each."""
    import tensorflow as tf

    rng = np.random.RandomState(0)
    x, y = rng.rand(8, 4, 4, 1).astype("float32"), rng.randint(0, 2, 8)
    flip = keras.layers.RandomFlip("horizontal", seed=1)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    if outside == "draws":
        ds = ds.map(lambda a, b: (flip(a), b))
    else:
        ds = ds.map(lambda a, b: (tf.py_function(lambda v: v, [a], tf.float32), b))
        ds = ds.map(lambda a, b: (tf.ensure_shape(a, (None, 4, 4, 1)), b))

    def fit(checkpoint, epochs):
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten()])
        model.add(keras.layers.Dense(2))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with det.core.init(**where.core_kwargs(), trial_id=1) as core:
            cb = det.keras.DeterminedCallback(core, checkpoint, 1, export_saved_model="never")
            model.fit(ds, epochs=epochs, verbose=0, callbacks=[cb])
            cb.wait()
            return cb, core.registry.list_checkpoints(trial_id=1)

    with caplog.at_level(logging.WARNING):
        _cb, rows = fit(None, 2)
    assert [r.steps_completed for r in rows] == [2, 4]
    warned = [r.message for r in caplog.records if "tf.data pipeline of this fit()" in r.message]
    assert len(warned) == 1, warned
    said = {"draws": "draws random numbers outside it", "python": "a Python function in it"}
    assert said[outside] in warned[0] and "is stateful" in warned[0]
    with det.core.init(**where.core_kwargs(), trial_id=1) as core:
        for row in rows:
            files = fmt.read_manifest(core.storage, row.uuid)["files"]
            positioned = any("data_iterator" in f for f in files)
            assert "callback_state.json" in files and positioned == (outside == "draws")
            with core.checkpoint.restore_path(row.uuid) as path:
                with open(os.path.join(path, "callback_state.json")) as f:
                    data = json.load(f)["data"]
            assert (data is not None) == (outside == "draws"), data
    cb, rows = fit(rows[-1].uuid, 3)
    assert cb.resumed and [r.steps_completed for r in rows] == [2, 4, 6]


class Sampling(keras.layers.Layer):
    """keras-io's VAE sampling layer: ``z_mean + exp(z_log_var / 2) * eps``, ``eps`` drawn from
    its own ``SeedGenerator(1337)``; it adds the KL divergence to the model's losses."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        kl = 1 + z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var)
        self.add_loss(-0.5 * keras.ops.mean(keras.ops.sum(kl, axis=1)))
        eps = keras.random.normal(keras.ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + keras.ops.exp(0.5 * z_log_var) * eps


def _seed_state(model):
    return keras.ops.convert_to_numpy(model.get_layer("sampling").seed_generator.state).tolist()


def test_a_vae_loaded_by_uuid_samples_as_keras_load_model_does(where):
    """A SeedGenerator's state is a variable of the model, but no weight of the ``.keras``
    format: ``keras.saving.load_model`` gives the loaded model its initial state (Keras 3.15, on
    TensorFlow, JAX and PyTorch), not the one training ended with. A load by UUID does the same
    (the same draws as Keras's own load of the checkpoint's model.keras); the checkpoint keeps
    the trained state for a resume (``callback_state.json``), which a resumed fit() restores."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(6, activation="relu")(inputs)
    z_mean, z_log_var = keras.layers.Dense(2)(h), keras.layers.Dense(2)(h)
    z = Sampling(name="sampling")([z_mean, z_log_var])
    vae = keras.Model(inputs, keras.layers.Dense(4, activation="sigmoid")(z))
    vae.compile(keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    x = np.random.RandomState(0).rand(8, 4).astype("float32")
    with det.core.init(**where.core_kwargs(), trial_id=1) as core:
        cb = det.keras.DeterminedCallback(core, None, 1, export_saved_model="never")
        vae.fit(x, x, batch_size=4, epochs=1, verbose=0, callbacks=[cb])
        cb.wait()
        uuid = cb.last_checkpoint
        with core.checkpoint.restore_path(uuid) as path:
            plain = keras.saving.load_model(
                os.path.join(path, "model.keras"), custom_objects={"Sampling": Sampling}
            )
            with open(os.path.join(path, "callback_state.json")) as f:
                kept = json.load(f)["extra_variables"]
    trained = _seed_state(vae)
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=uuid,
        storage=where.storage,
        registry=where.registry,
        custom_objects={"Sampling": Sampling},
    )
    assert trained == [1337, 2]  # one draw a step: 2 steps
    assert _seed_state(loaded) == _seed_state(plain) == [1337, 0]
    draws = [keras.ops.convert_to_numpy(m(x)) for m in (loaded, plain, vae)]
    assert np.array_equal(draws[0], draws[1])  # as Keras's own load draws
    assert not np.array_equal(draws[0], draws[2])  # the trained model draws on from its state
    assert [v["value"] for v in kept.values()] == [trained]  # what a resume puts back
