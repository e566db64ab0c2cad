"""Old import paths from before the package split (0.1), kept for one release.

``ckptstore.keras_io.core_context`` and friends moved to :mod:`ckptstore.core`,
:mod:`ckptstore.experiment` and :mod:`ckptstore.import_determined`. A meta-path finder answers
the old names with the new modules (the same module objects, so classes stay identical and
monkeypatching either name works) and warns once per name with a ``DeprecationWarning``.
No file is kept at the old places, so the import graph has no upward edges from them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module name -> new module name. Submodules of a moved package are mapped one by one.
MOVED: dict[str, str] = {
    "ckptstore.keras_io.core_context": "ckptstore.core._context",
    "ckptstore.keras_io.train_context": "ckptstore.core._train",
    "ckptstore.keras_io.preempt": "ckptstore.core._preempt",
    "ckptstore.keras_io.trial_info": "ckptstore.core._info",
    "ckptstore.keras_io.distributed": "ckptstore.core._distributed",
    "ckptstore.keras_io.experiment": "ckptstore.experiment",
    "ckptstore.keras_io.experiment.common": "ckptstore.experiment.common",
    "ckptstore.keras_io.experiment.config": "ckptstore.experiment.config",
    "ckptstore.keras_io.experiment.metrics": "ckptstore.experiment.metrics",
    "ckptstore.keras_io.experiment.runner": "ckptstore.experiment.runner",
    "ckptstore.keras_io.experiment.searcher": "ckptstore.experiment.searcher",
    "ckptstore.keras_io.experiment.worker": "ckptstore.keras_io.trial.worker",
    "ckptstore.keras_io.determined_weights": "ckptstore.import_determined.weights",
    "ckptstore.keras_io.fast_crc": "ckptstore.checkpointing.checksums",
    "ckptstore.keras_io.callback": "ckptstore.keras_io.determined_callback",
    "ckptstore.keras_io.callbacks": "ckptstore.keras_io.stateful_callbacks",
    "ckptstore.keras_io.trial.callbacks": "ckptstore.keras.callbacks",
    "ckptstore.checkpointing.determined_import": "ckptstore.import_determined.layouts",
    "ckptstore.checkpointing.gc": "ckptstore.checkpointing.retention",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; the old import path goes away in ckptstore 0.3. "
            f"Import {self.new} (or the public ckptstore.core / ckptstore.keras) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        # The new module is already executed; the import system only registers it under the
        # old name too.
        return None


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
