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


class ConfigKeys(NamedTuple):
    """How a Determined-style ``checkpoint_storage: {type: ...}`` dict maps to this backend.

    ``location`` is the key naming the bucket/container (the URL's host; None for types whose
    URL is built by :mod:`.config` from paths); ``required``/``optional`` are the other keys
    the type accepts; ``options`` are the keys passed on as storage options."""

    type: str
    location: str | None
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


class BackendEntry(NamedTuple):
    """Where a backend class lives, what to install when its import fails, and (when it has
    one) its ``checkpoint_storage`` type: a backend is this one row."""

    target: str  # "module:Class"
    install: str
    config: ConfigKeys | None = None


_LOCAL = BackendEntry("ckptstore.storage_backends.local:LocalStorage", "")
_S3 = BackendEntry(
    "ckptstore.storage_backends.s3:S3Storage",
    "pip install boto3",
    ConfigKeys(
        "s3",
        "bucket",
        optional=("prefix", "access_key", "secret_key", "endpoint_url", "region"),
        options=("access_key", "secret_key", "endpoint_url", "region"),
    ),
)
_GCS = BackendEntry(
    "ckptstore.storage_backends.gcs:GCSStorage",
    "pip install google-cloud-storage",
    ConfigKeys(
        "gcs",
        "bucket",
        optional=("prefix", "token", "project", "composite_threshold"),
        options=("token", "project", "composite_threshold"),
    ),
)
_AZURE = BackendEntry(
    "ckptstore.storage_backends.azure:AzureStorage",
    "pip install azure-storage-blob",
    ConfigKeys(
        "azure",
        "container",
        optional=("prefix", "connection_string", "account_url", "credential"),
        options=("connection_string", "account_url", "credential"),
    ),
)
_MEMORY = BackendEntry(
    "ckptstore.storage_backends.memory:MemoryStorage",
    "",
    ConfigKeys("memory", None, optional=("prefix",)),
)

#: URL scheme -> backend. Anything else falls back to :data:`FSSPEC_FALLBACK`.
BACKENDS: dict[str, BackendEntry] = {
    "file": _LOCAL,
    "local": _LOCAL,
    "memory": _MEMORY,
    "s3": _S3,
    "s3a": _S3,
    "gs": _GCS,
    "gcs": _GCS,
    "az": _AZURE,
    "abfs": _AZURE,
    "abfss": _AZURE,
}

#: Determined's path-based ``checkpoint_storage`` types: local files (no URL scheme of their own).
PATH_CONFIGS = (
    ConfigKeys(
        "shared_fs", None, ("host_path",), ("storage_path", "container_path", "propagation")
    ),
    ConfigKeys("directory", None, ("container_path",)),
)


def config_types() -> dict[str, tuple[str, ConfigKeys]]:
    """``checkpoint_storage`` type -> (URL scheme, its keys), from :data:`BACKENDS` (the first
    scheme of a backend is its URL's) and :data:`PATH_CONFIGS` (scheme ``file``)."""
    found: dict[str, tuple[str, ConfigKeys]] = {}
    for scheme, entry in BACKENDS.items():
        if entry.config is not None and entry.config.type not in found:
            found[entry.config.type] = (scheme, entry.config)
    for keys in PATH_CONFIGS:
        found[keys.type] = ("file", keys)
    return found


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


def register_backend(
    scheme: str, target: str, install: str = "", config: ConfigKeys | None = None
) -> None:
    """Add or replace the backend for ``scheme`` (``target`` is ``"module:Class"``); with
    ``config`` it is also a ``checkpoint_storage`` type (``{type: config.type, ...}``)."""
    if ":" not in target:
        raise InvalidStorageConfig(
            f"Backend target must look like 'package.module:Class'. Received: {target!r}"
        )
    BACKENDS[scheme] = BackendEntry(target, install, config)
