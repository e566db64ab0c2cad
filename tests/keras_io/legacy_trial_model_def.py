"""A TFKerasTrial model_def in Determined's shape, written against ``tf.keras``: on Keras 2
(``TF_USE_LEGACY_KERAS=1``) it compiles a Keras 2 ``Sequential`` with a legacy optimizer
(``tf.keras.optimizers.legacy.RMSprop``) or a Keras 2.11+ ``Adam`` and positional metrics, as
Determined's users wrote; on Keras 3 the same code gets Keras 3's ``RMSprop`` / ``Adam``.

Used in-process by ``tests/keras_io/test_trial_both_keras.py`` and, copied as ``model_def.py``,
through the experiment runner (``entrypoint: model_def:LegacyOptTrial``).

Hyperparameters: ``global_batch_size``, ``lr``, ``optimizer`` (``legacy`` / ``new``), ``data``
(``arrays``, ``in_memory``, ``dataset``, ``sequence``) and optionally ``custom_layer`` and
``stateful_rnn`` (a ``stateful=True`` LSTM, which carries its states from batch to batch).
"""

import numpy as np
import tensorflow as tf

import ckptstore as det

keras = tf.keras
N_RECORDS = 48


def make_data(seed):
    rng = np.random.RandomState(seed)
    x = rng.rand(N_RECORDS, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    return x, y


class Batches(keras.utils.Sequence):
    """A user's own ``tf.keras.utils.Sequence`` (a ``PyDataset`` on Keras 3)."""

    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.bs = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.bs)

    def __getitem__(self, i):
        return self.x[i * self.bs : (i + 1) * self.bs], self.y[i * self.bs : (i + 1) * self.bs]


class EpochCounter(det.keras.callbacks.Callback):
    """Stateful callback: counts batches and epochs; asks for preemption after batch
    ``preempt_at`` (inside a workload when it is not a multiple of ``scheduling_unit``)."""

    def __init__(self, preempt=None, preempt_at=None):
        super().__init__()
        self.batches = self.epochs = 0
        self.preempt, self.preempt_at = preempt, preempt_at

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.preempt is not None and self.batches == self.preempt_at:
            self.preempt.request_preemption()  # the controller stops after this batch

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1

    def get_state(self):
        return {"batches": self.batches, "epochs": self.epochs}

    def load_state(self, state):
        self.batches, self.epochs = int(state["batches"]), int(state["epochs"])


class Scale(keras.layers.Layer):
    """A user's custom layer (hparam ``custom_layer``): loading its model needs this class."""

    def build(self, input_shape):
        self.factor = self.add_weight(name="factor", shape=(), initializer="ones")

    def call(self, x):
        return x * self.factor


class LegacyOptTrial(det.keras.TFKerasTrial):
    #: Set by in-process tests: the core context's preempt and the batch to preempt after.
    preempt = None
    preempt_at = None
    last_counter = None

    def __init__(self, context):
        self.context = context

    def build_model(self):
        hparams = self.context.get_hparams()
        custom = [Scale()] if hparams.get("custom_layer") else []
        first = [keras.Input((4,)), *custom, keras.layers.Dense(6, activation="relu")]
        if hparams.get("stateful_rnn"):  # the 4 features as 4 time steps; fixed batch size
            bs = self.context.get_per_slot_batch_size()
            first = [keras.Input(batch_shape=(bs, 4)), keras.layers.Reshape((4, 1))]
            first.append(keras.layers.LSTM(6, stateful=True, unroll=True))  # no while loop
        model = keras.Sequential([*first, keras.layers.Dense(1)])
        model = self.context.wrap_model(model)
        lr = self.context.get_hparam("lr")
        keras2 = keras.__name__.startswith("tf_keras")  # tf.keras is Keras 2
        if self.context.get_hparam("optimizer") == "legacy" and keras2:
            opt = keras.optimizers.legacy.RMSprop(learning_rate=lr)
        elif self.context.get_hparam("optimizer") == "legacy":
            opt = keras.optimizers.RMSprop(learning_rate=lr)  # Keras 3: no legacy optimizers
        else:
            opt = keras.optimizers.Adam(learning_rate=lr)
        opt = self.context.wrap_optimizer(opt)
        if keras2:
            model.compile(opt, "mse", ["mae"])  # positional metrics, as Keras 2 code has
        else:
            model.compile(opt, "mse", metrics=["mae"])  # Keras 3: the third is loss_weights
        return model

    def _data(self, seed):
        x, y = make_data(seed)
        bs = self.context.get_per_slot_batch_size()
        kind = self.context.get_hparam("data")
        if kind == "arrays":
            return (x, y)
        if kind == "in_memory":
            return det.keras.InMemorySequence(x, y, bs)
        if kind == "dataset":
            return self.context.wrap_dataset(
                tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1).batch(bs)
            )
        if kind == "sequence":
            return det.keras.SequenceAdapter(Batches(x, y, bs), workers=2)
        raise ValueError(kind)

    def build_training_data_loader(self):
        return self._data(seed=0)

    def build_validation_data_loader(self):
        return self._data(seed=1)

    def keras_callbacks(self):
        counter = EpochCounter(LegacyOptTrial.preempt, LegacyOptTrial.preempt_at)
        LegacyOptTrial.last_counter = counter
        return [counter]
