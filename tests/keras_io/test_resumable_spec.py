"""DeterminedCallback's resumable array input gives its batches Keras's own spec, so the train
step Keras traced for the same input (an earlier fit()) is reused, not traced again."""

from __future__ import annotations

import numpy as np
import pytest

import ckptstore as det

keras = pytest.importorskip("keras")
if keras.__version__.startswith("2.") or keras.backend.backend() != "tensorflow":
    pytest.skip("Keras 3 on TensorFlow", allow_module_level=True)


def _traces(model) -> int:  # type: ignore[no-untyped-def]
    """How many times Keras's tf.function over the iterator was traced."""
    for cell in model.train_function.__closure__ or ():
        fn = cell.cell_contents
        if hasattr(fn, "experimental_get_tracing_count"):
            return int(fn.experimental_get_tracing_count())
    raise AssertionError("Keras's train function wraps no tf.function")


@pytest.mark.parametrize("samples", [64, 70])  # every batch full / a partial last batch
def test_a_fit_with_the_callback_reuses_the_traced_train_step(tmp_path, samples):
    x = np.random.default_rng(0).random((samples, 8), dtype="float32")
    y = np.random.default_rng(1).integers(0, 3, samples)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(x, y, epochs=1, verbose=0)
    assert _traces(model) == 1
    url, registry = str(tmp_path / "s"), f"sqlite:///{tmp_path / 'r.db'}"
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        model.fit(x, y, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
    assert _traces(model) == 1
