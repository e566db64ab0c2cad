"""Resumable input for ``fit()`` on both Kerases: a preempted epoch continues at its next unseen
batch, in the order an uninterrupted run would have seen (:mod:`._resumable` for Keras 3,
:mod:`._resumable_keras2` for Keras 2's ``tf_keras``). ``DeterminedCallback`` attaches it.

Example::

    from ckptstore.keras_io.data import ResumableData
"""

from ckptstore.keras_io.data._resumable import ResumableData

__all__ = ["ResumableData"]
