"""The table from URL scheme / config type to backend class, imported lazily.

Like fsspec's ``registry.py``: each entry names its class by import path and says which package
to install if the import fails, so optional SDKs are only needed for the backends in use.

Example::

    from ckptstore.storage_backends.schemes import backend_class
    cls = backend_class("s3")       # imports ckptstore.storage_backends.s3 on first use
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from ckptstore.errors import InvalidStorageConfig, MissingDependency
from ckptstore.storage_backends.base import Storage


class BackendEntry(NamedTuple):
    """Where a backend class lives and what to install when its import fails."""

    target: str  # "module:Class"
    install: str


_LOCAL = BackendEntry("ckptstore.storage_backends.local:LocalStorage", "")
_S3 = BackendEntry("ckptstore.storage_backends.s3:S3Storage", "pip install boto3")
_GCS = BackendEntry("ckptstore.storage_backends.gcs:GCSStorage", "pip install google-cloud-storage")
_AZURE = BackendEntry(
    "ckptstore.storage_backends.azure:AzureStorage", "pip install azure-storage-blob"
)

#: URL scheme -> backend. Anything else falls back to :data:`FSSPEC_FALLBACK`.
BACKENDS: dict[str, BackendEntry] = {
    "file": _LOCAL,
    "local": _LOCAL,
    "memory": BackendEntry("ckptstore.storage_backends.memory:MemoryStorage", ""),
    "s3": _S3,
    "s3a": _S3,
    "gs": _GCS,
    "gcs": _GCS,
    "az": _AZURE,
    "abfs": _AZURE,
    "abfss": _AZURE,
}

#: Any other protocol fsspec knows (``sftp://``, ``hdfs://``, ...).
FSSPEC_FALLBACK = BackendEntry(
    "ckptstore.storage_backends.fsspec_generic:FsspecStorage", "pip install fsspec"
)

_CACHE: dict[str, type[Storage]] = {}


def backend_class(scheme: str) -> type[Storage]:
    """The Storage class for ``scheme``; raises MissingDependency naming the pip command."""
    entry = BACKENDS.get(scheme, FSSPEC_FALLBACK)
    if entry.target in _CACHE:
        return _CACHE[entry.target]
    module_name, class_name = entry.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if (exc.name or "").startswith("ckptstore"):
            raise
        raise MissingDependency(
            f"Storage scheme {scheme!r} needs a package that is not installed "
            f"({exc.name or exc}); run: {entry.install}"
        ) from exc
    cls = getattr(module, class_name)
    _CACHE[entry.target] = cls
    return cls


def register_backend(scheme: str, target: str, install: str = "") -> None:
    """Add or replace the backend for ``scheme`` (``target`` is ``"module:Class"``)."""
    if ":" not in target:
        raise InvalidStorageConfig(
            f"Backend target must look like 'package.module:Class'. Received: {target!r}"
        )
    BACKENDS[scheme] = BackendEntry(target, install)
