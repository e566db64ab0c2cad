"""Export: inference SavedModels (``model.export()``) for checkpoints, built off the training thread.

Owns: the policy (:mod:`._policy`), one export and its verification (:mod:`._savedmodel`), the
worker process and its protocol (:mod:`._worker`), the exports of a callback's checkpoints
(:mod:`._checkpoint_exports`) and :func:`export_checkpoint` (:mod:`._export_checkpoint`).

Which checkpoints get one is an :class:`ExportPolicy` (``DeterminedCallback(...,
export_saved_model=...)``): ``"final"`` (default), ``"every"``, ``"best"`` or ``"never"``.

**Where the export runs: a worker process.** The training thread only takes the in-memory
snapshot it takes for every checkpoint. The callback's writer thread writes ``model.keras`` from
that snapshot into the checkpoint's staging folder and then asks an :class:`ExportWorker` — a
separate Python process started on the first export and kept for the rest of the run — to load
that file, call ``model.export()`` and verify the result. The checkpoint is committed only after
the worker answered "verified", so the manifest lists (and checksums) ``saved_model/``. A failed
export is best effort (:mod:`._best_effort`): the checkpoint commits without ``saved_model/``, its
metadata records why under ``missing``, and the run logs one warning naming the fix.

Why a process and not a thread: see :mod:`._worker`. The cost is the worker's start (importing
TensorFlow, a few CPU seconds, once per run) and its memory (a second copy of the model while
exporting). The worker imports the modules the
model config names for custom layers; classes defined in the training script itself
(``__main__``) cannot be found there, so such a model (and one without a config) is exported
in-process from the live model on the training thread instead, on Keras 3 as on Keras 2.

**Keras 2** (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``): the same, with a worker started with
``TF_USE_LEGACY_KERAS=1``. The writer thread writes the Keras 2 checkpoint (``model_checkpoint.*``
+ ``model_config.json``) from the snapshot; the worker rebuilds the model from the config
(importing the modules it names, unregistered classes included), loads the weights and writes
the SavedModel the training thread used to write (:func:`export_keras2_folder`:
``model.save(path, save_format="tf")``, signature ``serving_default``, readable by
``tf.keras.models.load_model``), verified against the rebuilt model. A model no other process can
rebuild — subclassed (its config does not describe its layers), not built when ``fit()`` starts,
or using classes/functions of the training script (``__main__``) — is detected when ``fit()``
starts (:func:`~ckptstore.keras_io.saving._keras2_format.worker_export_blocker`) and, as documented
fallback, exported on the training thread as before, with a warning saying why; any other
failure in the worker leaves the checkpoint without a SavedModel, as on Keras 3. :func:`export_checkpoint` of a Keras 2
checkpoint exports in the calling process when it runs Keras 2, else in a Keras 2 worker.

**Verification**: see :mod:`._savedmodel`.

**Adding a SavedModel later**: :func:`export_checkpoint` (``ckptstore checkpoint export UUID``)
exports a committed checkpoint's ``model.keras`` in the calling process and adds
``saved_model/`` to the same checkpoint with :mod:`ckptstore.checkpointing.amend`.

Example::

    from ckptstore.keras_io import exporting
    result = exporting.export_model_file("ckpt/model.keras", "ckpt/saved_model")
    print(result.max_abs_diff)
    exporting.export_checkpoint("0b7c...", storage="s3://bucket/ckpts")
"""

from ckptstore.keras_io.exporting._checkpoint_exports import CheckpointExports
from ckptstore.keras_io.exporting._export_checkpoint import export_checkpoint
from ckptstore.keras_io.exporting._policy import MODES, ExportPolicy
from ckptstore.keras_io.exporting._savedmodel import (
    ExportResult,
    custom_modules,
    export_keras2_folder,
    export_model_file,
)
from ckptstore.keras_io.exporting._worker import ExportWorker
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME, SAVED_MODEL_DIRNAME

__all__ = [
    "MODEL_FILENAME",
    "MODES",
    "SAVED_MODEL_DIRNAME",
    "CheckpointExports",
    "ExportPolicy",
    "ExportResult",
    "ExportWorker",
    "custom_modules",
    "export_checkpoint",
    "export_keras2_folder",
    "export_model_file",
]
