"""The one type name for a Keras model (Keras 3's ``keras.Model`` or Keras 2's
``tf_keras.Model``, whichever ``tf.keras`` is), below every package that handles one.

A structural :class:`~typing.Protocol` rather than ``keras.Model`` because most code that takes a
model must import without importing a Keras (loaders, the export worker's parent, the Keras 2
format code, the Determined migration code), and because the class differs between the two
Kerases. ``ckptstore.keras_io`` and ``ckptstore.import_determined`` both name it from here.

Example::

    from ckptstore.keras_model import KerasModel

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
