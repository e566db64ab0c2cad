"""``ckptstore.experimental.keras``: where Determined's older docs put the "new Keras API"
(``determined.experimental.keras.init()``); the same objects as ``ckptstore.keras.init`` and
``ckptstore.keras.DeterminedCallback``. Importing it imports Keras.

Example::

    from ckptstore.experimental import keras as det_keras

    with det_keras.init(storage="/tmp/ckpts") as context:
        ...
"""

from __future__ import annotations

from ckptstore.keras import DeterminedCallback, KerasContext, TensorBoard, init

__all__ = ["DeterminedCallback", "KerasContext", "TensorBoard", "init"]
