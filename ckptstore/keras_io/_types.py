"""The one type name for a Keras model in :mod:`ckptstore.keras_io`: :class:`ckptstore.keras_model.KerasModel`
(defined below keras_io, where the Determined migration code names it too).

Example::

    from ckptstore.keras_io._types import KerasModel

    def count_weights(model: KerasModel) -> int:
        return len(model.weights)
"""

from __future__ import annotations

from ckptstore.keras_model import KerasModel

__all__ = ["KerasModel"]
