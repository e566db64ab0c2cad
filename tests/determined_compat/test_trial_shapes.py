"""Shapes of Determined 0.38.1's TFKerasTrial harness fixtures (``keras_no_op``'s stateless
metric of Python's RNG) and of its data docs (a ``keras.utils.Sequence`` yielding
``(x, y, sample_weights)``, ``context.configure_fit(workers=..., use_multiprocessing=...,
max_queue_size=...)``, a nested hyperparameter group), in a trial preempted in the middle of
an epoch and resumed: the same weights, optimizer state and validation metrics (the metric drawn
from Python's RNG included) as an uninterrupted run."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tensorflow as tf

import ckptstore as det
from tests.determined_compat.test_tf_keras_trial_port import metrics
from tests.determined_compat.test_tf_keras_trial_port import run as run_trial
from tests.determined_compat.test_trial_breadth import _PreemptAt
from tests.keras_io.keras_under_test import keras, optimizer_variables

pytestmark = pytest.mark.e2e  # trains Keras models end to end


class DrawnMetric(keras.metrics.Metric):
    """No state: its result is a draw from Python's RNG (a preempted trial must restore it)."""

    def update_state(self, *args, **kwargs):
        return None

    def result(self):
        return tf.py_function(lambda: random.random(), [], tf.float64)


class WeightedBatches(keras.utils.Sequence):
    def __init__(self, n, batch_size, seed):
        super().__init__()
        rng = np.random.RandomState(seed)
        self.x = rng.normal(size=(n, 6)).astype("float32")
        self.y = (self.x.sum(axis=1, keepdims=True) > 0).astype("float32")
        self.w = rng.uniform(0.5, 1.5, size=n).astype("float32")
        self.batch_size = batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, i):
        s = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.x[s], self.y[s], self.w[s]


class SequenceTrial(det.keras.TFKerasTrial):
    def __init__(self, context):
        self.context = context
        context.configure_fit(workers=1, use_multiprocessing=False, max_queue_size=4)

    def build_model(self):
        arch = self.context.get_hparam("arch")
        hidden = [keras.layers.Dense(arch["units"], activation=arch["activation"])]
        model = keras.Sequential([keras.Input((6,)), *hidden, keras.layers.Dense(1)])
        model = self.context.wrap_model(model)
        model.compile(
            optimizer=self.context.wrap_optimizer(keras.optimizers.Adam(0.02)),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[DrawnMetric(name="drawn")],
        )
        return model

    def build_training_data_loader(self):
        return WeightedBatches(48, self.context.get_per_slot_batch_size(), 0)

    def build_validation_data_loader(self):
        return WeightedBatches(16, self.context.get_per_slot_batch_size(), 1)

    def keras_callbacks(self):
        return [_PreemptAt()]


CONFIG = {
    "hyperparameters": {
        "global_batch_size": 8,
        "arch": {"units": 5, "activation": "tanh"},  # a group: get_hparam gives the dict
    },
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 12}},
    "min_validation_period": {"batches": 4},
    "checkpoint_policy": "none",
}


def test_a_weighted_sequence_trial_resumes_mid_epoch_exactly(trial_env):
    _, registry = trial_env
    straight, result = run_trial(trial_env, SequenceTrial, CONFIG, trial_id=1)
    assert result.status == "completed" and "val_drawn" in result.last_validation
    _, result = run_trial(trial_env, SequenceTrial, CONFIG, trial_id=2, preempt_at=5)
    assert result.status == "preempted" and result.batches_trained == 5  # epoch 1 of 6 batches
    resumed, result = run_trial(trial_env, SequenceTrial, CONFIG, trial_id=2)
    assert result.status == "completed" and resumed.context.get_initial_batch() == 5
    for want, got in zip(
        [*straight.model.weights, *optimizer_variables(straight.model)],
        [*resumed.model.weights, *optimizer_variables(resumed.model)],
        strict=True,
    ):
        np.testing.assert_array_equal(want.numpy(), got.numpy())
    want, got = metrics(registry, 1, "validation"), metrics(registry, 2, "validation")
    assert [s for s, _ in got] == [4, 8, 12] == [s for s, _ in want]
    # after the resume (8, 12) the metric draws what the uninterrupted run drew
    assert [m["val_drawn"] for _, m in got[1:]] == [m["val_drawn"] for _, m in want[1:]]
    assert [m["val_loss"] for _, m in got] == pytest.approx([m["val_loss"] for _, m in want])
