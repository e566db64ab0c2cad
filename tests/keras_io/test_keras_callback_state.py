"""Keras's own callbacks' state and arrays in callback states (callback_arrays.npz), on the Keras
`tf.keras` is (Keras 3, and Keras 2 in `tests/keras_io/test_keras2_suite.py`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ckptstore as det
from ckptstore import errors
from ckptstore.keras_io.fit import _callback_state as callback_state
from ckptstore.keras_io.fit import _keras_callback_state as kcs
from tests.keras_io.keras_under_test import keras

arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
)
leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), arrays)
states = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


def assert_same(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@settings(max_examples=60, deadline=None)
@given(states)
def test_arrays_round_trip_through_json_and_npz(tmp_path_factory, state):
    plain, found = kcs.split_arrays(state)
    text = json.dumps(plain)  # no array left in the JSON part
    path = tmp_path_factory.mktemp("npz") / kcs.ARRAYS_FILENAME
    path.write_bytes(kcs.arrays_to_bytes(found))
    back = kcs.join_arrays(json.loads(text), kcs.arrays_from_file(str(path)))
    assert_same(state, back)


def test_missing_or_damaged_arrays_are_invalid_checkpoints(tmp_path):
    plain, _ = kcs.split_arrays({"w": [np.ones(2)]})
    with pytest.raises(errors.InvalidCheckpoint, match="damaged"):
        kcs.join_arrays(plain, {})
    bad = tmp_path / kcs.ARRAYS_FILENAME
    bad.write_bytes(b"not a zip")
    with pytest.raises(errors.InvalidCheckpoint, match="could not be read"):
        kcs.arrays_from_file(str(bad))


def test_keras_callbacks_get_state_adapters(tmp_path):
    stop = keras.callbacks.EarlyStopping(restore_best_weights=True)
    stop.wait, stop.best, stop.best_epoch = 2, float("inf"), 3
    stop.best_weights = [np.arange(3.0)]
    history = keras.callbacks.History()
    history.epoch, history.history = [0, 1], {"loss": [0.5, 0.25]}
    best = keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"), save_best_only=True)
    best.best = 0.125
    plateau = det.keras.ReduceLROnPlateau()
    plateau.wait, plateau.best = 1, 0.5
    fit_list = [stop, history, best, plateau, keras.callbacks.ProgbarLogger()]

    saved = {k: cb.get_state() for k, cb in callback_state.stateful_callbacks(fit_list).items()}
    assert sorted(saved) == ["EarlyStopping", "History", "ModelCheckpoint", "ReduceLROnPlateau"]
    plain, found = kcs.split_arrays(saved)
    saved = kcs.join_arrays(json.loads(json.dumps(plain)), found)

    fresh = [
        keras.callbacks.EarlyStopping(restore_best_weights=True),
        keras.callbacks.History(),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"), save_best_only=True),
        det.keras.ReduceLROnPlateau(),
    ]
    for key, cb in callback_state.stateful_callbacks(fresh).items():
        cb.load_state(saved[key])
    assert (fresh[0].wait, fresh[0].best, fresh[0].best_epoch) == (2, float("inf"), 3)
    np.testing.assert_array_equal(fresh[0].best_weights[0], np.arange(3.0))
    assert fresh[1].history == {"loss": [0.5, 0.25]} and fresh[1].epoch == [0, 1]
    assert fresh[2].best == 0.125
    assert (fresh[3].wait, fresh[3].best) == (1, 0.5)
