"""Trial classes in the shape of Determined 0.38.1's TFKerasTrial test fixtures (an XOR model
with ``hidden_size`` / ``learning_rate`` / ``global_batch_size`` / ``trial_type`` hparams and its
variants; a one-variable ``y = w * x`` model with an analytic loss; a trial whose model cannot
take its data; a trial whose metrics draw from the global random generators), written here for
``tests/determined_compat/test_tf_keras_trial_port.py``. They use ``tf.keras`` (Keras 2 under
``TF_USE_LEGACY_KERAS=1``, with legacy optimizers as Determined's fixtures have; else Keras 3).
"""

from __future__ import annotations

import os
import random

import numpy as np
import tensorflow as tf

import ckptstore as det
from tests.keras_io.keras_under_test import KERAS_MAJOR, keras

#: Keras 2's legacy optimizers (what Determined's fixtures compile with); Keras 3 has none.
OPTIMIZERS = keras.optimizers.legacy if KERAS_MAJOR == 2 else keras.optimizers


def xor_data() -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype="float32")
    return x, np.array([0, 1, 1, 0], dtype="float32")


def xor_error(y_true, y_pred):
    """1 - accuracy of the logit's sign (Determined's fixture names it ``categorical_error``;
    on one output that one is always 0, so it could not show a model that did not learn)."""
    return 1.0 - keras.metrics.binary_accuracy(y_true, y_pred, threshold=0.0)


def predictions(y_true, y_pred):
    return y_pred


class StopAfterFirstWorkload(det.keras.callbacks.Callback):
    def on_train_workload_end(self, total_batches_trained, logs=None):
        self.model.stop_training = True


class PreemptAfter(det.keras.callbacks.Callback):
    """Asks for preemption at the end of the workload that ends at batch ``at``."""

    def __init__(self, preempt, at):
        super().__init__()
        self.preempt, self.at = preempt, at

    def on_train_workload_end(self, total_batches_trained, logs):
        if self.preempt is not None and total_batches_trained == self.at:
            self.preempt.request_preemption()


#: Tests set ``preempt`` (the core context's) and ``at`` (a batch) before running a trial.
PREEMPTION: dict = {"preempt": None, "at": None}


def preemption() -> PreemptAfter:
    return PreemptAfter(PREEMPTION["preempt"], PREEMPTION["at"])


class XORTrial(det.keras.TFKerasTrial):
    """XOR with one hidden layer; the optimizer is wrapped with ``context.wrap_optimizer``."""

    def __init__(self, context):
        self.context = context
        self.context.configure_fit(verbose=False, workers=0)

    def hidden_layer(self):
        size = self.context.get_hparam("hidden_size")
        return keras.layers.Dense(size, activation="tanh")

    def optimizer(self):
        lr = self.context.get_hparam("learning_rate")
        return self.context.wrap_optimizer(OPTIMIZERS.SGD(learning_rate=lr))

    def metrics(self):
        return [xor_error]

    def loss(self):
        return keras.losses.BinaryCrossentropy(from_logits=True)

    def build_model(self):
        model = keras.Sequential([keras.Input((2,)), self.hidden_layer(), keras.layers.Dense(1)])
        model = self.context.wrap_model(model)
        model.compile(optimizer=self.optimizer(), loss=self.loss(), metrics=self.metrics())
        return model

    def build_training_data_loader(self):
        x, y = xor_data()
        return det.keras.InMemorySequence(x, y, self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self):
        return self.build_training_data_loader()

    def keras_callbacks(self):
        stop = [StopAfterFirstWorkload()] if self.context.get_hparams().get("stop_early") else []
        return [*stop, preemption()]


class XORTrialOldOptimizerAPI(XORTrial):
    """The optimizer goes to ``compile`` without ``context.wrap_optimizer``."""

    def optimizer(self):
        return OPTIMIZERS.SGD(learning_rate=self.context.get_hparam("learning_rate"))


class XORTrialWithTrainingMetrics(XORTrial):
    def metrics(self):
        return [xor_error, keras.metrics.binary_accuracy, predictions]


class CustomOptimizer(OPTIMIZERS.SGD):
    pass


class CustomDenseLayer(keras.layers.Dense):
    pass


class XORTrialWithCustomObjects(XORTrial):
    """A custom layer subclass, optimizer subclass (with gradient clipping and a learning-rate
    schedule), activation and loss."""

    @staticmethod
    def custom_activation(x):
        return tf.math.tanh(x)

    @staticmethod
    def custom_loss(y_true, y_pred):
        return keras.losses.binary_crossentropy(y_true, y_pred, from_logits=True)

    def hidden_layer(self):
        size = self.context.get_hparam("hidden_size")
        return CustomDenseLayer(size, activation=self.custom_activation)

    def optimizer(self):
        lr = self.context.get_hparam("learning_rate")
        schedule = keras.optimizers.schedules.ExponentialDecay(lr, decay_steps=4, decay_rate=0.9)
        return self.context.wrap_optimizer(CustomOptimizer(learning_rate=schedule, clipnorm=1.0))

    def loss(self):
        return self.custom_loss

    def metrics(self):
        return [xor_error, keras.metrics.binary_accuracy, predictions]


class XORTrialWithOptimizerState(XORTrial):
    """Adam: slots that a resume must restore."""

    def optimizer(self):
        lr = self.context.get_hparam("learning_rate")
        return self.context.wrap_optimizer(OPTIMIZERS.Adam(learning_rate=lr / 10))


class EventLog(det.keras.callbacks.Callback):
    """Records every hook as ``name:args``; its state is the log, so a resumed trial goes on
    writing the log of the run it continues (``load_state`` replaces what this run wrote)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def _log(self, *parts):
        self.lines.append(":".join(str(p) for p in parts))

    def on_train_begin(self, logs=None):
        self._log("on_train_begin")

    def on_train_end(self, logs=None):
        self._log("on_train_end")

    def on_epoch_begin(self, epoch, logs=None):
        self._log("on_epoch_begin", epoch)

    def on_epoch_end(self, epoch, logs=None):
        self._log("on_epoch_end", epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._log("on_train_batch_begin", batch)

    def on_train_batch_end(self, batch, logs=None):
        self._log("on_train_batch_end", batch)

    def on_test_begin(self, logs=None):
        self._log("on_test_begin")

    def on_test_end(self, logs=None):
        self._log("on_test_end", sorted(logs or {}))

    def on_train_workload_begin(self, total_batches_trained, batches_requested, logs):
        self._log("on_train_workload_begin", total_batches_trained, batches_requested)

    def on_train_workload_end(self, total_batches_trained, logs):
        self._log("on_train_workload_end", total_batches_trained)

    def on_checkpoint_end(self, checkpoint_dir):
        # Determined passes the folder as a str, with the checkpoint's files already in it
        self._log(
            "on_checkpoint_end",
            isinstance(checkpoint_dir, str) and os.listdir(checkpoint_dir) != [],
        )

    def get_state(self):
        self._log("get_state")
        return list(self.lines)

    def load_state(self, state):
        self.lines = list(state)
        self._log("load_state")


class OneVarTrial(det.keras.TFKerasTrial):
    """``y_hat = w * x`` with ``w`` starting at 0, trained on ``x = y = 0 .. dataset_range - 1``
    (a wrapped tf.data pipeline) with SGD and mean squared error: every loss is known."""

    last_log: EventLog | None = None

    def __init__(self, context):
        self.context = context

    def _data(self):
        n = self.context.get_hparam("dataset_range")
        bs = self.context.get_per_slot_batch_size()
        values = tf.data.Dataset.range(n).map(lambda v: tf.cast(v, tf.float32))
        ds = tf.data.Dataset.zip((values.batch(bs), values.batch(bs)))
        return self.context.wrap_dataset(ds)

    def build_training_data_loader(self):
        return self._data()

    def build_validation_data_loader(self):
        return self._data()

    def build_model(self):
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
        )
        model = self.context.wrap_model(model)
        lr = self.context.get_hparam("learning_rate")
        model.compile(self.context.wrap_optimizer(OPTIMIZERS.SGD(learning_rate=lr)), "mse")
        return model

    @staticmethod
    def calc_gradient(w, values):
        # d/dw (x - w x)^2 = -2 x^2 (1 - w), averaged over the batch as Keras does
        return float(np.mean([-2 * v * v * (1 - w) for v in values]))

    @staticmethod
    def calc_loss(w, values):
        return float(np.mean([(v - w * v) ** 2 for v in values]))

    def keras_callbacks(self):
        hparams = self.context.get_hparams()
        if "epochs" not in hparams and not hparams.get("event_log"):
            return [preemption()]
        OneVarTrial.last_log = log = EventLog()
        return [
            log,
            det.keras.callbacks.TensorBoard(),
            det.keras.callbacks.ReduceLROnPlateau(monitor="val_loss"),
            det.keras.callbacks.EarlyStopping(restore_best_weights=True, patience=1),
            preemption(),
        ]


class RuntimeErrorTrial(det.keras.TFKerasTrial):
    """A model that cannot take its data: Keras's own error must reach the caller."""

    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = self.context.wrap_model(keras.Sequential([keras.layers.Dense(10)]))
        model.compile(
            optimizer=OPTIMIZERS.Adam(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.Accuracy()],
        )
        return model

    def build_training_data_loader(self):
        return np.zeros(1), np.zeros(1)

    def build_validation_data_loader(self):
        return np.zeros(1), np.zeros(1)


def _draw(source):
    def result():
        return tf.py_function(lambda: np.float64(source()), [], tf.float64)

    return result


class RandomMetric(keras.metrics.Metric):
    """A metric whose value is a draw from one global random generator."""

    def __init__(self, source, **kwargs):
        super().__init__(**kwargs)
        self._result = _draw(source)

    def update_state(self, *args, **kwargs):
        return None

    def result(self):
        return self._result()

    def reset_state(self):
        return None


def _tf_draw():
    return tf.random.get_global_generator().uniform([], dtype=tf.float64).numpy()


class RandomMetricsTrial(det.keras.TFKerasTrial):
    """Metrics drawn from Python's, NumPy's and TensorFlow's global generators."""

    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = keras.Sequential([keras.Input((8, 8)), keras.layers.Dense(8)])
        model = self.context.wrap_model(model)
        model.compile(
            loss="mse",
            optimizer=self.context.wrap_optimizer(OPTIMIZERS.SGD()),
            metrics=[
                RandomMetric(random.random, name="rand_rand"),
                RandomMetric(np.random.random, name="np_rand"),
                RandomMetric(_tf_draw, name="tf_rand"),
            ],
        )
        return model

    def build_training_data_loader(self):
        return np.ones((16, 8, 8), "float32"), np.ones((16, 8, 8), "float32")

    def build_validation_data_loader(self):
        return np.ones((16, 8, 8), "float32"), np.ones((16, 8, 8), "float32")

    def keras_callbacks(self):
        return [preemption()]
