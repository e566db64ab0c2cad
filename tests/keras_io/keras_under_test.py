"""The Keras the Keras tests run on: ``tf.keras`` — Keras 3, or Keras 2 (``tf_keras``) when the
suite runs with ``TF_USE_LEGACY_KERAS=1`` (see ``tests/keras_io/test_keras2_suite.py``).

Test modules and worker scripts that should pass on both import ``keras`` from here, as a user's
``tf.keras`` code would, instead of ``import keras``. A test of such a module that only makes sense
on Keras 3 says so with :func:`keras3_only` (the Keras 2 run deselects it by its marker).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import tensorflow as tf

keras = tf.keras
#: 2 or 3.
KERAS_MAJOR = 2 if keras.__name__.startswith("tf_keras") else 3
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
assert (KERAS_MAJOR == 2) == LEGACY, (keras.__version__, LEGACY)

_Test = TypeVar("_Test")

#: The mark of the Keras 2 only modules (``KERAS2_ONLY`` in ``tests/conftest.py``), which train
#: end to end in the Keras 2 child of ``tests/keras_io/test_keras2_suite.py``.
KERAS2_ONLY_MODULE = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        KERAS_MAJOR != 2,
        reason="Keras 2 only: runs in tests/keras_io/test_keras2_suite.py's Keras 2 child",
    ),
]


def keras3_only(reason: str) -> Callable[[_Test], _Test]:
    """Marks a test as Keras 3 only (marker ``keras3_only``, with ``reason``).

    ``tests/keras_io/test_keras2_suite.py`` deselects these (``-m "not keras3_only"``) and fails on
    any skip; run by hand under ``TF_USE_LEGACY_KERAS=1`` they skip, saying why.
    """

    def mark(test: _Test) -> _Test:
        test = pytest.mark.skipif(KERAS_MAJOR == 2, reason=f"Keras 3 only: {reason}")(test)
        return pytest.mark.keras3_only(reason=reason)(test)

    return mark


def variable_path(variable: Any) -> str:
    """A variable's stable name: ``path`` on Keras 3, ``name`` on Keras 2."""
    return getattr(variable, "path", None) or variable.name


def optimizer_variables(model: Any) -> list[Any]:
    """Every variable of ``model.optimizer`` (a property on Keras 3, a method on Keras 2)."""
    found = model.optimizer.variables
    return list(found() if callable(found) else found)


def tiny_model(
    *,
    inputs: int = 4,
    hidden: int = 5,
    extra: Any = None,
    outputs: int = 2,
    seed: int = 5,
    optimizer: Any = None,
    loss: Any = "mse",
    metrics: list[str] | None = None,
) -> Any:
    """A seeded, compiled ``Sequential``: ``Input(inputs)`` -> ``Dense(hidden, relu)`` (none when
    ``hidden`` is 0) -> ``extra`` (a layer, when given) -> ``Dense(outputs)``; the optimizer is
    ``Adam(0.01)`` unless given. The Keras tests' one model builder: each module names its variant.
    """
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(hidden, activation="relu")] if hidden else []
    layers += [extra] if extra is not None else []
    model = keras.Sequential([*layers, keras.layers.Dense(outputs)])
    model.compile(optimizer or keras.optimizers.Adam(0.01), loss=loss, metrics=metrics)
    return model
