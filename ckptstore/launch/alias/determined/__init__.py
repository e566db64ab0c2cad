"""``determined`` inside processes ckptstore starts: every ``determined.X`` is ``ckptstore.X``.

This folder is put first on ``PYTHONPATH`` only for the processes ckptstore launches (see
``ckptstore.launch.process``), so Determined code runs there without an edit. It is not part of
the ``ckptstore`` package and is never on ``sys.path`` anywhere else.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys

_ALIAS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PREFIX = "determined"


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already imported ``ckptstore`` module instead of a second copy, so
    ``determined.keras.TFKerasTrial is ckptstore.keras.TFKerasTrial``."""

    def __init__(self, target):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set __spec__ to the alias spec; ckptstore's module keeps its own.
        if self._spec is not None:
            module.__spec__ = self._spec

    def get_code(self, fullname):
        # `python -m determined.launch.tensorflow` runs ckptstore.launch.tensorflow's code.
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PREFIX + "."):
            return None
        real = "ckptstore" + fullname[len(_PREFIX) :]
        spec = importlib.util.find_spec(real)
        if spec is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(real), is_package=spec.submodule_search_locations is not None
        )


def _real_determined():
    """Where a real ``determined`` is installed (searching sys.path without this folder)."""
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ALIAS_DIR]
    spec = importlib.machinery.PathFinder.find_spec(_PREFIX, others)
    return spec.origin if spec is not None else None


def _install():
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    ckptstore = importlib.import_module("ckptstore")
    real = _real_determined()
    who = os.environ.get("CKPTSTORE_DETERMINED_ALIAS") or "ckptstore"
    note = (
        f" The determined package installed at {os.path.dirname(real)} is NOT used in this "
        "process; run the script outside ckptstore to use it."
        if real
        else ""
    )
    logging.getLogger("ckptstore.determined_alias").warning(
        "`import determined` uses ckptstore %s (%s), set up by `%s`.%s",
        getattr(ckptstore, "__version__", "?"),
        os.path.dirname(ckptstore.__file__),
        who,
        note,
    )
    return ckptstore


sys.modules[__name__] = _install()
