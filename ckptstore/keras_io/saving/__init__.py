"""Saving a checkpoint off the training thread: the in-memory snapshot of a model's training state
(:mod:`._snapshot`), the one-pass ``.keras`` archive writer (:mod:`._keras_archive`), the
background writer thread that writes and uploads (:mod:`._writer`), the byte ranges of tensors
in TensorFlow's checkpoint files for deduplicated commits (:mod:`._tf_bundle`), and the Keras 2
checkpoint format Determined wrote (:mod:`._keras2_format`). Imports no Keras until used.

Example::

    from ckptstore.keras_io.saving import CheckpointWriter, take_snapshot
"""

from ckptstore.keras_io.saving._keras2_format import written_by_keras2
from ckptstore.keras_io.saving._snapshot import SAVED_MODEL_DIRNAME, Snapshot, take_snapshot
from ckptstore.keras_io.saving._writer import CheckpointWriter, SaveJob

__all__ = [
    "SAVED_MODEL_DIRNAME",
    "CheckpointWriter",
    "SaveJob",
    "Snapshot",
    "take_snapshot",
    "written_by_keras2",
]
