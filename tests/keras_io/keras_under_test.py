"""The Keras the Keras tests run on: ``tf.keras`` — Keras 3, or Keras 2 (``tf_keras``) when the
suite runs with ``TF_USE_LEGACY_KERAS=1`` (see ``tests/keras_io/test_keras2_suite.py``).

Test modules and worker scripts that should pass on both import ``keras`` from here, as a user's
``tf.keras`` code would, instead of ``import keras``.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

keras = tf.keras
#: 2 or 3.
KERAS_MAJOR = 2 if keras.__name__.startswith("tf_keras") else 3
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
assert (KERAS_MAJOR == 2) == LEGACY, (keras.__version__, LEGACY)


def variable_path(variable: Any) -> str:
    """A variable's stable name: ``path`` on Keras 3, ``name`` on Keras 2."""
    return getattr(variable, "path", None) or variable.name


def optimizer_variables(model: Any) -> list[Any]:
    """Every variable of ``model.optimizer`` (a property on Keras 3, a method on Keras 2)."""
    found = model.optimizer.variables
    return list(found() if callable(found) else found)
