"""A tiny TFKerasTrial for tests; the ``data_type`` hparam picks the training data type."""

import keras
import numpy as np
import tensorflow as tf

from ckptstore.keras import InMemorySequence, SequenceAdapter, TFKerasTrial, callbacks

N_RECORDS = 64


def make_data(n=N_RECORDS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    return x, y


class PlainSequence(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, weights=False):
        super().__init__()
        self.x, self.y, self.bs, self.weights = x, y, batch_size, weights
        self.epochs_ended = 0

    def __len__(self):
        return -(-len(self.x) // self.bs)

    def __getitem__(self, i):
        sl = slice(i * self.bs, (i + 1) * self.bs)
        if self.weights:
            return self.x[sl], self.y[sl], np.ones(len(self.x[sl]), "float32")
        return self.x[sl], self.y[sl]

    def on_epoch_end(self):
        self.epochs_ended += 1


class BatchCounter(callbacks.Callback):
    """Stateful: counts batches and workloads; asks for preemption at ``preempt_at``."""

    def __init__(self, preempt=None, preempt_at=None):
        super().__init__()
        self.batches = 0
        self.workloads = []
        self.checkpoints = 0
        self.preempt, self.preempt_at = preempt, preempt_at
        self.hooks = []  # on_train_begin / load_state, in the order the controller calls them

    def on_train_begin(self, logs=None):
        self.hooks.append("on_train_begin")

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_train_workload_begin(self, total_batches_trained, batches_requested, logs):
        self.workloads.append((total_batches_trained, batches_requested))

    def on_train_workload_end(self, total_batches_trained, logs):
        assert "loss" in logs
        if self.preempt is not None and total_batches_trained == self.preempt_at:
            self.preempt.request_preemption()

    def on_checkpoint_end(self, checkpoint_dir):
        self.checkpoints += 1

    def get_state(self):
        return {"batches": self.batches}

    def load_state(self, state):
        self.hooks.append("load_state")
        self.batches = state["batches"]


class TinyTrial(TFKerasTrial):
    #: Set by tests to reach the core context's preempt (same process only).
    preempt = None
    preempt_at = None
    last_counter = None

    def __init__(self, context):
        self.context = context

    def build_model(self):
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
        )
        model = self.context.wrap_model(model)
        opt = self.context.wrap_optimizer(keras.optimizers.Adam(0.01))
        model.compile(
            optimizer=opt,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        return model

    def _data(self, seed):
        x, y = make_data(seed=seed)
        bs = self.context.get_per_slot_batch_size()
        kind = self.context.get_hparam("data_type")
        if kind == "arrays":
            return (x, y)
        if kind == "arrays_weights":
            return (x, y, np.linspace(0.5, 1.5, len(x)).astype("float32"))
        if kind == "dataset":
            return self.context.wrap_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(bs))
        if kind == "pydataset":
            return PlainSequence(x, y, bs, weights=True)
        if kind == "adapter_threads":
            return SequenceAdapter(PlainSequence(x, y, bs), workers=2, use_multiprocessing=False)
        if kind == "adapter_processes":
            return SequenceAdapter(PlainSequence(x, y, bs), workers=1, use_multiprocessing=True)
        if kind == "in_memory":
            return InMemorySequence(x, y, bs)
        raise ValueError(kind)

    def build_training_data_loader(self):
        return self._data(seed=0)

    def build_validation_data_loader(self):
        return self._data(seed=1)

    def keras_callbacks(self):
        counter = BatchCounter(TinyTrial.preempt, TinyTrial.preempt_at)
        TinyTrial.last_counter = counter
        return [counter]
