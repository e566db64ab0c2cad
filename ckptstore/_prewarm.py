"""The registry's SQLAlchemy import, started on a background thread at ``import ckptstore``.

Opening a registry imports SQLAlchemy (about 0.3-0.5 CPU-s), the largest single part of a
frozen-backbone resume's start (issue 41). A script imports ``ckptstore`` first, then builds
its model and calls ``core.init``: this thread imports SQLAlchemy while the model is built, so
``core.init`` finds it imported. Nothing else changes: the modules are the same, an error
in the thread is dropped (the import in ``core.init`` raises it again where it is handled),
and ``CKPTSTORE_PREWARM=0`` turns the thread off.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

#: What ``core.init`` with a SQLite registry imports from SQLAlchemy (a PostgreSQL URL adds its
#: own dialect). Third-party modules only: a thread importing ckptstore's own modules while the
#: script imports others of them can meet a circular import half-way from the other end, and
#: Python then hands one thread a partly initialised module (an ImportError). SQLAlchemy never
#: imports ckptstore, so the script's thread at worst waits for the module the thread holds.
MODULES = ("sqlalchemy", "sqlalchemy.dialects.sqlite")


def _import_all() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the caller's own import raises it where it is handled
            return


def start() -> threading.Thread | None:
    """Start the thread (a daemon: it never delays the interpreter's exit), unless turned off
    or already done."""
    if os.environ.get("CKPTSTORE_PREWARM", "1") == "0" or all(m in sys.modules for m in MODULES):
        return None
    thread = threading.Thread(target=_import_all, name="ckptstore-prewarm", daemon=True)
    thread.start()
    return thread
