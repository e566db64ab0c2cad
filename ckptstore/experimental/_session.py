"""The registry and storage the SDK client reads (Determined's client talked to a master).

Default: ``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE``, else the default SQLite registry and
local folder (see :mod:`ckptstore.defaults`); :func:`ckptstore.experimental.client.configure`
changes them for the process.

Example::

    session = Session(registry="sqlite:///runs/registry.db", storage="s3://bucket/ckpts")
    registry = session.registry()
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage


class Session:
    """Opens the registry once and a storage per checkpoint location (cached)."""

    def __init__(
        self,
        registry: Registry | str | None = None,
        storage: str | Mapping[str, Any] | Storage | None = None,
    ) -> None:
        self._registry_spec = registry
        self._storage_spec = storage
        self._registry: Registry | None = None
        self._storages: dict[str, Storage] = {}
        self._lock = threading.Lock()

    def registry(self) -> Registry:
        """The registry (opened on first use)."""
        from ckptstore.registry import open_registry

        with self._lock:
            if self._registry is None:
                self._registry = open_registry(self._registry_spec)
            return self._registry

    def storage(self, recorded_url: str | None = None, *, follow: bool = False) -> Storage:
        """The configured storage, else the one a checkpoint row recorded when
        :func:`~ckptstore.checkpointing.row_storage.storage_of_row` trusts it (under
        ``CKPTSTORE_STORAGE`` / the default, or ``CKPTSTORE_ALLOWED_STORAGE``; ``follow``: a
        download also follows S3/GCS/Azure bucket URLs), else the default."""
        from ckptstore.checkpointing.row_storage import storage_of_row
        from ckptstore.storage_backends.spec import resolve

        config = resolve(self._storage_spec)
        if config.instance is not None:
            return config.instance
        row_url = None
        if self._storage_spec is None:
            row_url = storage_of_row(recorded_url, config.url, follow=follow)
        key = row_url or config.to_env()
        with self._lock:
            if key not in self._storages:
                self._storages[key] = config.open_at(row_url) if row_url else config.open()
            return self._storages[key]

    def close(self) -> None:
        """Close what this session opened."""
        with self._lock:
            for storage in self._storages.values():
                storage.close()
            self._storages.clear()
            if self._registry is not None and self._registry is not self._registry_spec:
                self._registry.close()
            self._registry = None


_default: Session | None = None
_default_lock = threading.Lock()


def default_session() -> Session:
    """The process-wide session (created on first use from the environment)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Session()
        return _default


def set_default_session(session: Session) -> None:
    """Replace the process-wide session (closing the old one)."""
    global _default
    with _default_lock:
        old, _default = _default, session
    if old is not None:
        old.close()


def check_path(path: str | os.PathLike[str] | None, uuid: str) -> str:
    """Determined's default download folder: ``checkpoints/<uuid>`` under the working dir."""
    if path is None:
        return os.path.join("checkpoints", uuid)
    if not isinstance(path, (str, os.PathLike)):
        raise errors.InvalidConfig(
            f"path must be a folder path. Received: path={path!r} ({type(path).__name__})."
        )
    return os.fspath(path)


__all__ = ["Session", "check_path", "default_session", "set_default_session"]
