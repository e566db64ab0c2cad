"""Keras's per-type skip sets are computed once per thread, not once per layer walked (issue 41):
a resume's load and the walks after it build no throwaway ``Layer()`` per layer, and the
weights they read are the same."""

from __future__ import annotations

import threading

import numpy as np
import pytest

keras = pytest.importorskip("keras")
if keras.__version__.startswith("2."):
    pytest.skip("Keras 3's saving_lib", allow_module_level=True)

from keras.src.saving import saving_lib  # noqa: E402

from ckptstore.keras_io.saving import _skipsets as skipsets  # noqa: E402
from ckptstore.keras_io.saving import _weights_view as weights_view  # noqa: E402


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), epochs=1, verbose=0)
    return model


def _in_fresh_thread(fn):  # type: ignore[no-untyped-def]
    """``fn()`` on a new thread: Keras's global state (and so the cache) is per thread."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_after_prime_keras_reuses_one_skip_set_per_type():
    def run():  # type: ignore[no-untyped-def]
        model = _model()
        unprimed = saving_lib.get_attr_skipset("Layer") is saving_lib.get_attr_skipset("Layer")
        fresh = set(saving_lib.get_attr_skipset("Sequential"))
        skipsets.prime(model)
        return (
            unprimed,
            saving_lib.get_attr_skipset("Layer") is saving_lib.get_attr_skipset("Layer"),
            saving_lib.get_attr_skipset("Sequential") is saving_lib.get_attr_skipset("Sequential"),
            saving_lib.get_attr_skipset("Sequential") == fresh,
        )

    unprimed, layer_cached, model_cached, same_set = _in_fresh_thread(run)
    if unprimed:
        pytest.skip("this Keras finds its own cache")
    assert layer_cached and model_cached and same_set


def test_loading_through_the_weights_view_leaves_the_cache_shared(tmp_path):
    path = str(tmp_path / "m.keras")
    saved = _model()
    saved.save(path)
    expected = [v.numpy() for v in saved.weights + saved.optimizer.variables]

    def run():  # type: ignore[no-untyped-def]
        model = _model()
        model.optimizer.build(model.trainable_variables)
        weights_view.load_weights(model, path)
        # the optimizer's type was met by the load's walk, and is cached for the next ones
        cached = saving_lib.get_attr_skipset("Optimizer") is saving_lib.get_attr_skipset(
            "Optimizer"
        )
        return cached, [v.numpy() for v in model.weights + model.optimizer.variables]

    cached, loaded = _in_fresh_thread(run)
    assert cached
    assert len(loaded) == len(expected)
    for a, b in zip(loaded, expected, strict=True):
        np.testing.assert_array_equal(a, b)
