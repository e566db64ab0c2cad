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
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

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
    "ckptstore.keras_io.callback": "ckptstore.keras_io.fit._callback",
    "ckptstore.keras_io.callbacks": "ckptstore.keras_io.fit._stateful",
    "ckptstore.keras_io.trial.callbacks": "ckptstore.keras.callbacks",
    "ckptstore.checkpointing.determined_import": "ckptstore.import_determined.layouts",
    "ckptstore.checkpointing.gc": "ckptstore.checkpointing.retention",
    # keras_io by concern (0.2): flat modules moved into sub-packages. A module moved whole maps
    # to its private module (private names and monkeypatching keep working); export.py was split,
    # so its old name maps to the package, whose public list holds all its public names.
    "ckptstore.keras_io.determined_callback": "ckptstore.keras_io.fit._callback",
    "ckptstore.keras_io.callback_state": "ckptstore.keras_io.fit._callback_state",
    "ckptstore.keras_io.keras_callback_state": "ckptstore.keras_io.fit._keras_callback_state",
    "ckptstore.keras_io.stateful_callbacks": "ckptstore.keras_io.fit._stateful",
    "ckptstore.keras_io.tensorboard": "ckptstore.keras_io.fit._tensorboard",
    "ckptstore.keras_io.mwms_compat": "ckptstore.keras_io.fit._mwms_compat",
    "ckptstore.keras_io.snapshot": "ckptstore.keras_io.saving._snapshot",
    "ckptstore.keras_io.checkpoint_writer": "ckptstore.keras_io.saving._writer",
    "ckptstore.keras_io.tf_bundle": "ckptstore.keras_io.saving._tf_bundle",
    "ckptstore.keras_io.keras2_format": "ckptstore.keras_io.saving._keras2_format",
    "ckptstore.keras_io.keras_archive": "ckptstore.keras_io.saving._keras_archive",
    "ckptstore.keras_io.export": "ckptstore.keras_io.exporting",
    "ckptstore.keras_io.loaders": "ckptstore.keras_io.loading._loaders",
    "ckptstore.keras_io.resumable_data": "ckptstore.keras_io.data._resumable",
    "ckptstore.keras_io.resumable_data_keras2": "ckptstore.keras_io.data._resumable_keras2",
    "ckptstore.keras_io.keras_context": "ckptstore.keras_io.context._context",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # Point at the public package, not at a private module (``pkg._x`` -> ``pkg``).
        public = self.new.split("._")[0]
        warnings.warn(
            f"{self.old} moved to {self.new}; the old import path goes away in ckptstore 0.3. "
            f"Import {public} (or the public ckptstore.core / ckptstore.keras) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        # The new module is already executed; the import system only registers it under the
        # old name too.
        return None

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old name>`` (runpy asks the loader for code): the new module's code, or
        its package's ``__main__``, with the same warning."""
        self.create_module(importlib.machinery.ModuleSpec(fullname, self))
        spec = importlib.util.find_spec(self.new)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(self.new + ".__main__")
        loader = getattr(spec, "loader", None)
        return loader.get_code(spec.name) if spec is not None and loader is not None else None


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        # origin: what runpy puts in sys.argv[0] for `python -m <old name>`.
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new), origin=new)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
