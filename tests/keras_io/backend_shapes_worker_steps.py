"""Scripts of backend_shapes_worker.py whose training step is their own or the backend's: a
``train_step`` in JAX's stateless style and in PyTorch's (``zero_grad()``/``backward()``),
``keras.distribution``'s ``DataParallel`` and ``ModelParallel`` on two JAX devices, gradient
accumulation, ``steps_per_execution``, and keras-io's PyTorch GAN drawing from its own
``SeedGenerator``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tests.keras_io.backend_shapes_worker_base import (
    ARRAYS,
    BATCH,
    BATCH_SPECS,
    N,
    Shape,
    compiled,
    dense_body,
    numbers,
)


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


def _two_devices() -> list[Any]:
    import jax

    devices = jax.devices()
    if len(devices) != 2:
        raise RuntimeError(f"needs 2 JAX devices (XLA_FLAGS), found {devices}")
    return devices


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
        model = compiled(ShardingProbe(inputs, outputs))
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


def shape_gradient_accumulation() -> Shape:
    """An optimizer that applies the mean of every 4 steps' gradients: SIGTERM after step 6
    leaves 2 steps' gradients accumulated (BatchNormalization's statistics move every step)."""
    x, y = numbers()
    inputs = keras.Input((4,))
    model = keras.Model(inputs, dense_body(keras.layers.BatchNormalization()(inputs)))
    optimizer = keras.optimizers.Adam(0.01, gradient_accumulation_steps=4)
    return Shape(compiled(model, optimizer), (x, y), ARRAYS, x)


def shape_jax_steps_per_execution() -> Shape:
    """``compile(steps_per_execution=2)`` over a shuffled tf.data epoch of 3 batches (executions
    of 2 and 1; PyTorch's Keras refuses k > 1): SIGTERM after epoch 2's first execution."""
    import tensorflow as tf

    x, y = numbers()
    ds = tf.data.Dataset.from_tensor_slices((x[:12], y[:12])).shuffle(12, seed=4).batch(BATCH)
    inputs = keras.Input((4,))
    model = compiled(keras.Model(inputs, dense_body(inputs)), steps_per_execution=2)
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


#: shape -> the backends it runs on
SHAPES = {
    "jax_stateless_train_step": (shape_jax_stateless_train_step, ("jax",)),
    "torch_train_step": (shape_torch_train_step, ("torch",)),
    "torch_gan_seed_generator": (shape_torch_gan_seed_generator, ("torch",)),
    "jax_data_parallel": (shape_jax_data_parallel, ("jax",)),
    "jax_model_parallel": (shape_jax_model_parallel, ("jax",)),
    "gradient_accumulation": (shape_gradient_accumulation, ("jax", "torch")),
    "jax_steps_per_execution": (shape_jax_steps_per_execution, ("jax",)),
}
