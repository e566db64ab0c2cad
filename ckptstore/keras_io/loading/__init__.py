"""Loading Keras models from ckptstore checkpoints: from a local folder or ``.keras`` file, or by
trial / UUID from storage (:func:`load_checkpoint_model`, also ``ckptstore.load_checkpoint_model``).
Imports no Keras until a model is loaded. Determined's checkpoint layouts are read by
``ckptstore.keras.load_model_from_checkpoint_path``, a layer above.

Example::

    from ckptstore.keras_io.loading import load_checkpoint_model

    model = load_checkpoint_model(trial_id=3, storage="s3://bucket/ckpts")
"""

from ckptstore.keras_io.loading._in_place import readable_folder
from ckptstore.keras_io.loading._loaders import (
    SavedModelPredictor,
    load_checkpoint_model,
    load_folder_in_place,
    load_model_from_folder,
    resolve_checkpoint,
)

__all__ = [
    "SavedModelPredictor",
    "load_checkpoint_model",
    "load_folder_in_place",
    "load_model_from_folder",
    "readable_folder",
    "resolve_checkpoint",
]
