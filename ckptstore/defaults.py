"""Where ckptstore keeps things when the caller does not say.

- ``CKPTSTORE_HOME`` (default ``$XDG_DATA_HOME/ckptstore`` or ``~/.local/share/ckptstore``)
- storage: ``CKPTSTORE_STORAGE`` or ``<home>/checkpoints`` (local files)
- registry: ``CKPTSTORE_REGISTRY`` or ``sqlite:///<home>/registry.db``
- restore cache: ``CKPTSTORE_CACHE_DIR`` or ``<home>/cache`` (:mod:`ckptstore.checkpointing.cache`)

Example::

    from ckptstore import defaults
    print(defaults.default_storage_url(), defaults.default_registry_url())
"""

from __future__ import annotations

import os
from pathlib import Path

STORAGE_ENV = "CKPTSTORE_STORAGE"
REGISTRY_ENV = "CKPTSTORE_REGISTRY"
HOME_ENV = "CKPTSTORE_HOME"

#: Folders beside the checkpoints in a storage: TensorBoard logs
#: (``<storage>/tensorboard/<trial id>/``, written by ``ckptstore.keras.TensorBoard``),
#: the output of trials the experiment runner started (``<storage>/logs/<trial id>/``) and
#: each trial's metadata (``<storage>/trial_metadata/<trial id>.json``, written by
#: ``core_context.train.set_metadata``).
TENSORBOARD_PREFIX = "tensorboard"
TRIAL_LOGS_PREFIX = "logs"
TRIAL_METADATA_PREFIX = "trial_metadata"


def home() -> Path:
    """ckptstore's per-user data folder (not created here)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "ckptstore"


def default_storage_url() -> str:
    """``CKPTSTORE_STORAGE`` if set, else the local folder ``<home>/checkpoints``."""
    return os.environ.get(STORAGE_ENV) or str(home() / "checkpoints")


def default_registry_url() -> str:
    """``CKPTSTORE_REGISTRY`` if set, else a SQLite file ``<home>/registry.db``."""
    return os.environ.get(REGISTRY_ENV) or f"sqlite:///{home() / 'registry.db'}"
