"""Resumable input for ``fit()`` on both Kerases: a preempted epoch continues at its next unseen
batch, in the order an uninterrupted run would have seen (:mod:`._resumable` for Keras 3 on
TensorFlow, :mod:`._resumable_jax` on JAX and PyTorch, :mod:`._resumable_torch` for a torch
``DataLoader`` on any of the three and the entry point of all three, :mod:`._resumable_keras2`
for Keras 2's ``tf_keras``). ``DeterminedCallback`` attaches the one :func:`for_running_keras` names.

Example::

    from ckptstore.keras_io.data import ResumableData
"""

from types import ModuleType

from ckptstore.keras_io import backend
from ckptstore.keras_io.data._resumable import ResumableData


def for_running_keras() -> ModuleType:
    """The module (``attach``, ``restore_metrics``) for the running Keras and backend."""
    if backend.IS_KERAS2:
        from ckptstore.keras_io.data import _resumable_keras2 as module
    else:  # a torch DataLoader there, every other input through the backend's own module
        from ckptstore.keras_io.data import _resumable_torch as module
    return module


__all__ = ["ResumableData", "for_running_keras"]
