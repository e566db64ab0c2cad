"""Which Keras ckptstore runs on: the one ``tf.keras`` is — Keras 3 (``keras``) or Keras 2
(``tf_keras``, when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported).

This module is the one place that decides; every other module of :mod:`ckptstore.keras_io`
imports ``keras`` from here (``from ckptstore.keras_io.backend import keras``), so class bases
(``keras.callbacks.Callback``) and the save/load code follow the user's Keras without the user
saying which. The choice is made once, at first import, with TensorFlow's own rule:

- if ``tf.keras`` was already resolved (TensorFlow imported and ``tf.keras`` touched), that
  module decides;
- else ``TF_USE_LEGACY_KERAS`` in ``("1", "true", "True")`` — the test TensorFlow's lazy
  ``tf.keras`` loader makes — means Keras 2.

Mixing is refused, not guessed around: a model built with the other Keras raises
:class:`~ckptstore.errors.KerasMismatch` from :func:`check_model`.

Example::

    from ckptstore.keras_io import backend
    print(backend.KERAS_MAJOR, backend.keras.__name__)   # 2 tf_keras  /  3 keras
    backend.check_model(model)                           # raises KerasMismatch on a mix-up
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType
from typing import Any

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel

logger = logging.getLogger(__name__)

#: TensorFlow's switch for Keras 2 (``tf_keras``) behind ``tf.keras``.
LEGACY_ENV = "TF_USE_LEGACY_KERAS"
_TRUE = ("1", "true", "True")


def legacy_keras_requested() -> bool:
    """Whether ``tf.keras`` is (or will be) Keras 2, by TensorFlow's own rule."""
    tf = sys.modules.get("tensorflow")
    loader = getattr(tf, "__dict__", {}).get("keras") if tf is not None else None
    if loader is not None and getattr(loader, "_tfll_initialized", False):
        return getattr(loader, "_tfll_keras_version", None) == "tf_keras"
    return os.environ.get(LEGACY_ENV) in _TRUE


def _import_keras() -> tuple[ModuleType, int]:
    if legacy_keras_requested():
        try:
            import tf_keras
        except ImportError as exc:
            raise errors.MissingDependency(
                f"{LEGACY_ENV}=1 makes tf.keras Keras 2, which needs the tf_keras package. "
                f"Received: {LEGACY_ENV}={os.environ.get(LEGACY_ENV)!r} without tf_keras. "
                "Install it (`pip install tf_keras` matching your TensorFlow) or unset "
                f"{LEGACY_ENV} to use Keras 3."
            ) from exc
        return tf_keras, 2
    import keras

    return keras, int(keras.__version__.split(".")[0])


keras, KERAS_MAJOR = _import_keras()
#: True when ckptstore runs on Keras 2 (``tf_keras``).
IS_KERAS2 = KERAS_MAJOR == 2
#: ``"keras-3.15.1"`` / ``"tf_keras-2.21.0"``: recorded in every checkpoint's ``metadata.json``.
FRAMEWORK = f"{keras.__name__}-{keras.__version__}"
#: The top-level package name of this Keras (``"keras"`` or ``"tf_keras"``).
PACKAGE = keras.__name__.split(".")[0]
_OTHER = "keras" if IS_KERAS2 else "tf_keras"


def backend_name() -> str:
    """The Keras backend (always ``"tensorflow"`` on Keras 2)."""
    return "tensorflow" if IS_KERAS2 else keras.backend.backend()


def graph_mode() -> bool:
    """True when the process turned eager execution off
    (``tf.compat.v1.disable_eager_execution()``, as TF1-era model_defs did at import). Keras 2
    then builds graph-mode (``training_v1``) models, whose ``train_on_batch`` / ``evaluate``
    have no ``return_dict``; Keras 3 cannot train there at all."""
    import tensorflow as tf

    return not tf.compat.v1.executing_eagerly_outside_functions()


def check_eager(what: str) -> None:
    """:class:`~ckptstore.errors.NotSupported` when Keras 3 would have to train in graph mode."""
    if IS_KERAS2 or not graph_mode():
        return
    raise errors.NotSupported(
        f"{what} runs on Keras 3, which trains only with eager execution on, but this process "
        "called tf.compat.v1.disable_eager_execution(). Received: tf.executing_eagerly()=False. "
        f"Remove that call (TensorFlow 2 traces the training step itself), or set "
        f"{LEGACY_ENV}=1 before TensorFlow is imported to train it on Keras 2 in graph mode."
    )


#: Keras 3 backends DeterminedCallback, the loaders and the Keras API checkpoint on (docs:
#: the compatibility table's backend column).
SUPPORTED_BACKENDS = ("tensorflow", "jax", "torch")


def check_backend(what: str, supported: tuple[str, ...] = SUPPORTED_BACKENDS) -> None:
    """:class:`~ckptstore.errors.NotSupported` naming the Keras backend ``what`` cannot run on
    (TFKerasTrial on anything but TensorFlow; see the compatibility page)."""
    name = backend_name()
    if name in supported:
        return
    raise errors.NotSupported(
        f"{what} runs on the Keras backends {', '.join(supported)}, not {name!r}. Received: "
        f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', name)!r} (keras.backend.backend() == "
        f"{name!r}). Set KERAS_BACKEND={' or '.join(supported)} before Keras is imported."
    )


def saved_model_export(requested: Any) -> Any:
    """``requested`` (an export policy), or ``"never"`` with one warning when the SavedModel
    cannot be written: off TensorFlow, Keras's ``model.export()`` converts the model with
    TensorFlow, which may be missing (ckptstore installs it except on arm64)."""
    import importlib.util

    if backend_name() == "tensorflow" or importlib.util.find_spec("tensorflow") is not None:
        return requested
    if requested != "never":
        logger.warning(
            "Checkpoints will commit without saved_model/: Keras exports a SavedModel on %s "
            "through TensorFlow, which is not installed. Install tensorflow-cpu for it, or pass "
            "export_saved_model='never' to silence this.",
            backend_name(),
        )
    return "never"


def keras_of(obj: Any) -> str | None:
    """``"keras"`` or ``"tf_keras"``: the Keras package ``obj``'s class comes from, else None."""
    for cls in type(obj).__mro__:
        root = (cls.__module__ or "").split(".")[0]
        if root in ("keras", "tf_keras"):
            return root
    return None


def check_model(model: KerasModel, *, what: str = "DeterminedCallback") -> None:
    """Raise :class:`~ckptstore.errors.KerasMismatch` if ``model`` is from the other Keras."""
    got = keras_of(model)
    if got is None or got == PACKAGE:
        return
    raise errors.KerasMismatch(
        f"{what} runs on {FRAMEWORK} (tf.keras is {'Keras 2' if IS_KERAS2 else 'Keras 3'}), "
        f"but the model is a {got} model. Received: {type(model).__module__}."
        f"{type(model).__qualname__}. Build the model with tf.keras (or "
        f"{'tf_keras' if IS_KERAS2 else 'keras'}) in the same process, or "
        + (
            f"unset {LEGACY_ENV} before importing TensorFlow to use Keras 3."
            if IS_KERAS2
            else f"set {LEGACY_ENV}=1 before importing TensorFlow to use Keras 2."
        )
    )


class CallbackBase(keras.callbacks.Callback):
    """``keras.callbacks.Callback`` of the running Keras that refuses a model of the other one.

    Keras 2's ``CallbackList`` calls ``set_model`` before anything else, so this is the first
    place a mix-up can be seen; without the check it would surface later as an obscure
    ``AttributeError`` inside Keras.
    """

    def set_model(self, model: KerasModel) -> None:
        check_model(model, what=type(self).__name__)
        super().set_model(model)
