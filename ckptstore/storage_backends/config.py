"""Determined-style ``checkpoint_storage`` dicts -> (URL, storage options).

Example::

    from ckptstore.storage_backends.config import parse_storage_config, split_storage_config
    storage_dict, gc = split_storage_config(
        {"type": "s3", "bucket": "ckpts", "prefix": "exp", "save_trial_latest": 2}
    )
    url, options = parse_storage_config(storage_dict)   # ("s3://ckpts/exp", {})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ckptstore.errors import InvalidStorageConfig
from ckptstore.storage_backends.schemes import config_types
from ckptstore.validators import int_at_least

#: Determined's checkpoint garbage-collection keys; not storage settings.
GC_KEYS = ("save_experiment_best", "save_trial_best", "save_trial_latest")
#: ckptstore's own checkpoint key (not Determined's): ``dedup: false`` turns incremental
#: (deduplicated) checkpoints off; they are on by default on every storage.
DEDUP_KEY = "dedup"

#: Transfer/retry options any backend accepts (see ObjectStorage).
COMMON_OPTIONS = (
    "concurrency",
    "part_size",
    "download_part_size",
    "multipart_threshold",
    "max_attempts",
    "timeout",
)


def split_storage_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``checkpoint_storage`` dict into (storage keys, GC keys).

    The GC dict holds whichever of ``save_experiment_best``, ``save_trial_best`` and
    ``save_trial_latest`` were present, for the checkpointing layer's retention policy.
    """
    if not isinstance(config, Mapping):
        raise InvalidStorageConfig(
            f"checkpoint_storage must be a dict. Received: {type(config).__name__}"
        )
    storage = {k: v for k, v in config.items() if k not in GC_KEYS and k != DEDUP_KEY}
    gc = {k: v for k, v in config.items() if k in GC_KEYS}
    for key, value in gc.items():
        if value is not None:
            int_at_least(f"checkpoint_storage.{key}", value, 0, error=InvalidStorageConfig)
    return storage, gc


def dedup_option(config: Mapping[str, Any]) -> bool | None:
    """The ``dedup`` key of a ``checkpoint_storage`` dict: True/False, or None when absent (then
    the checkpoint context's default applies: on, on every storage)."""
    value = config.get(DEDUP_KEY) if isinstance(config, Mapping) else None
    if value is None or isinstance(value, bool):
        return value
    raise InvalidStorageConfig(
        f"checkpoint_storage.{DEDUP_KEY} must be true or false. Received: {value!r}"
    )


def _str(config: Mapping[str, Any], key: str) -> str:
    value = config[key]
    if not isinstance(value, str) or not value:
        shown = "<hidden>" if key in ("access_key", "secret_key", "credential") else repr(value)
        raise InvalidStorageConfig(
            f"checkpoint_storage.{key} must be a non-empty string. Received: {key}={shown}"
        )
    return value


def parse_storage_config(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Turn a ``checkpoint_storage`` dict into ``(url, storage_options)`` for open_storage.

    Unknown keys and missing required keys raise
    :class:`~ckptstore.errors.InvalidStorageConfig` naming the key; GC keys are ignored.
    """
    storage, _gc = split_storage_config(config)
    kind = storage.get("type")
    types = config_types()
    if kind is None:
        raise InvalidStorageConfig(
            f"checkpoint_storage is missing the required key 'type'; use one of {sorted(types)}."
        )
    if kind not in types:
        raise InvalidStorageConfig(
            f"checkpoint_storage.type {kind!r} is not supported; use one of {sorted(types)}."
        )
    scheme, keys = types[kind]
    required = ((keys.location,) if keys.location else ()) + keys.required
    allowed = {"type", *required, *keys.optional, *COMMON_OPTIONS}
    for key in storage:
        if key not in allowed:
            raise InvalidStorageConfig(
                f"checkpoint_storage has unknown key {key!r} for type {kind!r}; allowed keys: "
                f"{sorted(allowed - {'type'})}."
            )
    for key in required:
        if storage.get(key) in (None, ""):
            raise InvalidStorageConfig(
                f"checkpoint_storage of type {kind!r} is missing the required key {key!r}."
            )
    options = {k: storage[k] for k in COMMON_OPTIONS if k in storage}
    prefix = storage.get("prefix") or ""
    if prefix and not isinstance(prefix, str):
        raise InvalidStorageConfig(
            f"checkpoint_storage.prefix must be a string. Received: prefix={prefix!r}"
        )
    prefix = prefix.strip("/")
    if kind == "shared_fs":
        return _shared_fs_path(storage), options
    if kind == "directory":
        return _str(storage, "container_path"), options
    for key in keys.options:
        if storage.get(key) is not None:
            # Credentials and endpoints are strings; other options (a GCS token dict, a
            # threshold) are the backend's to check.
            secretish = key in ("access_key", "secret_key", "endpoint_url", "region")
            options[key] = _str(storage, key) if secretish else storage[key]
    host = _str(storage, keys.location) if keys.location else ""
    tail = f"/{quote(prefix, safe='/')}" if prefix else ""
    return (f"{scheme}://{host}{tail}" if host else f"{scheme}://{prefix}"), options


def _shared_fs_path(storage: Mapping[str, Any]) -> str:
    """Determined's shared_fs: ``host_path`` joined with ``storage_path`` (never outside it)."""
    host = _str(storage, "host_path")
    sub = storage.get("storage_path") or ""
    if sub and not isinstance(sub, str):
        raise InvalidStorageConfig(
            f"checkpoint_storage.storage_path must be a string. Received: {sub!r}"
        )
    if os.path.isabs(sub):
        real_host = os.path.abspath(host)
        real_sub = os.path.abspath(sub)
        if os.path.commonpath([real_host, real_sub]) != real_host:
            raise InvalidStorageConfig(
                f"checkpoint_storage.storage_path {sub!r} must be inside host_path {host!r}."
            )
        return real_sub
    if ".." in sub.replace("\\", "/").split("/"):
        raise InvalidStorageConfig(f"checkpoint_storage.storage_path {sub!r} may not contain '..'.")
    return os.path.join(host, sub) if sub else host
