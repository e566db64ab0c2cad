"""The one type name for a Keras model in :mod:`ckptstore.keras_io` (Keras 3's ``keras.Model``
or Keras 2's ``tf_keras.Model``, whichever ``tf.keras`` is).

A structural :class:`~typing.Protocol` rather than ``keras.Model`` because most of keras_io
must import without importing a Keras (loaders, the export worker's parent, the Keras 2 format
code), and because the class differs between the two Kerases.

Example::

    from ckptstore.keras_io._types import KerasModel

    def count_weights(model: KerasModel) -> int:
        return len(model.weights)
"""

from __future__ import annotations

from typing import Any, Protocol


class KerasModel(Protocol):
    """What ckptstore uses of a Keras model: its variables, optimizer and the fit/predict API."""

    optimizer: Any
    stop_training: bool

    @property
    def weights(self) -> list[Any]: ...

    @property
    def layers(self) -> list[Any]: ...

    def fit(self, *args: Any, **kwargs: Any) -> Any: ...

    def predict(self, *args: Any, **kwargs: Any) -> Any: ...

    def get_config(self) -> dict[str, Any]: ...


__all__ = ["KerasModel"]
