"""Secondary artifacts are best effort: a checkpoint that cannot get its full model
(``model.keras``'s config, Keras 2's ``model_config.json``) or its SavedModel still commits
with what resumes training (weights, every optimizer's state, callback state, data position,
RNG), its metadata says what is missing and why (``metadata["missing"]``), and the run logs ONE
warning per missing artifact naming the cause and the fix (:class:`Shortfalls`).

Where an export runs (:func:`export_blocker`): the worker process rebuilds the model from the
checkpoint's files, which it cannot when the config names classes of the training script
(``__main__``) or there is no usable config; such a model is exported on the training thread
from the live model instead (:func:`export_live`), on Keras 3 as on Keras 2.

Example::

    shortfalls = Shortfalls()
    shortfalls.record(metadata, SAVED_MODEL, "ExportError: ...")  # warns the first time only
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import MutableMapping
from typing import Any

from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving._keras2_format import script_classes

logger = logging.getLogger(__name__)

#: ``metadata.json`` key: ``{artifact: why it is missing}``.
MISSING_KEY = "missing"
#: Artifact names in ``metadata["missing"]``.
MODEL_CONFIG = "model_config"
SAVED_MODEL = "saved_model"

_WHAT = {
    MODEL_CONFIG: "full model (its config; only weights and optimizer state were saved)",
    SAVED_MODEL: "inference SavedModel (saved_model/)",
}

FIX = (
    "Fix: decorate the model's custom layers/models with "
    "@keras.saving.register_keras_serializable() in a module the script imports, and give "
    "those whose __init__ takes non-serializable arguments a get_config(); or load with "
    "custom_objects={...}, or load the weights into a model you build: "
    "ckptstore.load_checkpoint_model(..., model=build_model). A SavedModel can be added "
    "later with `ckptstore checkpoint export UUID`."
)
#: The fix when a torch model's SavedModel cannot be made: the worker rebuilds the model on
#: TensorFlow from model.keras, which a class of the training script defeats; in-process, Keras's
#: torch export goes through torch.export and torch_xla.
TORCH_FIX = (
    "Fix: move the custom layers/models out of the training script into a module it imports "
    "and decorate them with @keras.saving.register_keras_serializable(): the export worker then "
    "rebuilds the model on TensorFlow from the checkpoint's model.keras (Keras's in-process "
    "export on torch needs torch.export and torch_xla). Or add the SavedModel later where "
    "that module imports: `ckptstore checkpoint export UUID --module <module>`."
)


class Shortfalls:
    """Records missing artifacts in a checkpoint's metadata; warns once per artifact per run.

    Thread-safe (the writer thread records failed exports, the training thread the rest)."""

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def record(
        self, metadata: MutableMapping[str, Any], artifact: str, reason: str, fix: str = FIX
    ) -> None:
        metadata.setdefault(MISSING_KEY, {})[artifact] = reason
        if artifact == SAVED_MODEL:
            metadata["saved_model"] = False
        if artifact == MODEL_CONFIG:
            metadata["full_model"] = False
        with self._lock:
            first = artifact not in self._warned
            self._warned.add(artifact)
        if first:
            logger.warning(
                "Checkpoints of this run are saved without their %s: %s. Training and "
                "resuming are not affected (weights, optimizer state, callbacks, data "
                "position and RNG are in every checkpoint). %s",
                _WHAT[artifact],
                reason,
                fix,
            )


def config_shortfall(layout: Any) -> str | None:
    """Why ``layout``'s model has no saved config (None: it has one)."""
    error = getattr(layout, "config_error", None)  # Keras 3
    if error:
        return f"its config cannot be serialized ({' '.join(error.split())[:500]})"
    if hasattr(layout, "export_blocker") and getattr(layout, "config_json", "") is None:
        return "it is subclassed and has no get_config() (Keras 2 model.to_json() failed)"
    return None


def export_blocker(layout: Any) -> str | None:
    """Why the export worker could not rebuild ``layout``'s model (None: it can)."""
    if hasattr(layout, "export_blocker"):  # Keras 2: its own checks (subclassed, not built)
        return layout.export_blocker
    shortfall = config_shortfall(layout)
    if shortfall:
        return shortfall
    found = script_classes(layout.config_json)
    if found:
        return f"the model uses {found} defined in the training script (__main__)"
    return None


def live_export_blocker() -> str | None:
    """Why this process cannot export a live model itself (None: it can try): on torch, Keras
    converts through ``torch.export`` and ``torch_xla``, which may be missing."""
    import importlib.util

    from ckptstore.keras_io import backend

    if backend.backend_name() != "torch" or importlib.util.find_spec("torch_xla") is not None:
        return None
    return "Keras's in-process SavedModel export on torch needs torch_xla, which is not installed"


def live_export_fix() -> str:
    """The fix a failed (or not tried) export of the live model names on this backend."""
    from ckptstore.keras_io import backend

    return TORCH_FIX if backend.backend_name() == "torch" else FIX


def export_live(model: KerasModel, out_dir: str) -> None:
    """The inference SavedModel of the live ``model`` (training thread), verified on Keras 3."""
    from ckptstore.keras_io import backend

    if backend.IS_KERAS2:
        from ckptstore.keras_io.saving import _keras2_format as keras2_format

        keras2_format.export_saved_model(model, out_dir)
        return
    from ckptstore.keras_io.exporting._savedmodel import _save_and_verify, _verify, export_once

    result = _save_and_verify(
        lambda: export_once(model, out_dir),
        "model.export() of the training model failed",
        lambda: _verify(model, out_dir),
        out_dir,
        time.perf_counter(),
    )
    logger.info("SavedModel exported in-process (max |serve - keras| %.2g)", result.max_abs_diff)


def reason_of(exc: BaseException) -> str:
    """One line of an export failure for metadata and the warning."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    # Keras's "could not deserialize" messages quote the whole config before the class it
    # could not find: keep that part.
    missing = re.search(r"Could not locate (?:class|function) '[^']+'", text)
    if missing and missing.start() > 300:
        return f"{text[:300]} ... {missing.group(0)}"
    return text[:500]


__all__ = [
    "FIX",
    "MISSING_KEY",
    "MODEL_CONFIG",
    "SAVED_MODEL",
    "TORCH_FIX",
    "Shortfalls",
    "config_shortfall",
    "export_blocker",
    "export_live",
    "live_export_blocker",
    "live_export_fix",
    "reason_of",
    "script_classes",
]
