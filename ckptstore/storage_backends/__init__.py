"""Storage backends: one :class:`Storage` contract over local disk, memory, S3, GCS, Azure Blob
and any other fsspec protocol.

Example::

    from ckptstore.storage_backends import open_storage

    storage = open_storage("s3://my-bucket/ckpts", concurrency=32)
    storage = open_storage({"type": "shared_fs", "host_path": "/mnt/nfs"})
    storage.upload("/tmp/ckpt", "0b7c")
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ckptstore.errors import InvalidStorageConfig
from ckptstore.storage_backends.base import ProgressCallback, Selector, Storage
from ckptstore.storage_backends.config import (
    GC_KEYS,
    dedup_option,
    parse_storage_config,
    split_storage_config,
)
from ckptstore.storage_backends.paths import check_key
from ckptstore.storage_backends.schemes import backend_class, register_backend
from ckptstore.storage_backends.urls import check_storage_spec

#: What every public ``storage=`` argument takes: a URL or path, a Determined
#: ``checkpoint_storage`` dict, or a :class:`Storage` already opened (then used as it is).
StorageSpec = str | os.PathLike[str] | Mapping[str, Any] | Storage

__all__ = [
    "GC_KEYS",
    "ProgressCallback",
    "Selector",
    "Storage",
    "StorageSpec",
    "check_key",
    "check_storage_spec",
    "dedup_option",
    "open_storage",
    "parse_storage_config",
    "register_backend",
    "split_storage_config",
    "url_scheme",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(url: str) -> str:
    """``"s3"`` for ``s3://b/p``, ``"file"`` for plain paths and ``file:`` URLs."""
    match = _SCHEME.match(url)
    if match:
        return match.group(1).lower()
    return "file"


def open_storage(
    spec: str | os.PathLike[str] | Mapping[str, Any] | Storage, **storage_options: Any
) -> Storage:
    """Open the storage named by a URL, a path or a Determined ``checkpoint_storage`` dict.

    Args:
        spec: ``s3://bucket/prefix``, ``gs://``/``gcs://``, ``az://container/prefix``,
            ``abfs://``, ``file:///path`` or a plain path, ``memory://name``, any installed fsspec
            protocol; or a dict with ``type`` s3/gcs/azure/shared_fs/directory. An existing
            :class:`Storage` is returned unchanged.
        **storage_options: backend options (``concurrency``, ``part_size``,
            ``download_part_size``, ``multipart_threshold``, ``max_attempts``, ``timeout``, credentials such as
            ``endpoint_url``, ``connection_string``); they override the dict's keys.

    Raises:
        InvalidStorageConfig: malformed URL/dict, unknown or missing keys.
        MissingDependency: the backend's SDK is not installed (message has the pip command).
    """
    if isinstance(spec, Storage):
        return spec
    if isinstance(spec, Mapping):
        url, options = parse_storage_config(spec)
        options.update(storage_options)
    elif isinstance(spec, (str, os.PathLike)):
        url, options = os.fspath(spec), dict(storage_options)
    else:
        raise InvalidStorageConfig(
            "open_storage needs a URL, a path or a checkpoint_storage dict. "
            f"Received: {type(spec).__name__}"
        )
    check_storage_spec(url)
    cls = backend_class(url_scheme(url))
    try:
        return cls(url, **options)
    except TypeError as exc:
        raise InvalidStorageConfig(
            f"Storage option not accepted by {cls.__name__}: {exc}. Check the option names."
        ) from None
