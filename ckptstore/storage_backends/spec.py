"""A storage spec parsed once where it enters, and the one precedence rule.

A spec enters as an argument (``core.init(storage=...)``, ``load_checkpoint_model``, the SDK),
as ``CKPTSTORE_STORAGE`` (a URL or a JSON ``checkpoint_storage`` object), as an experiment
config's ``checkpoint_storage`` block or as a registry row; :func:`resolve` turns it into a
:class:`StorageConfig` (URL, backend options, Determined's retention keys, ``dedup``), which is
what every layer below receives and what a child process gets back through :meth:`to_env`.

Example::

    from ckptstore.storage_backends.spec import StorageConfig, resolve

    config = resolve({"type": "s3", "bucket": "b", "save_trial_best": 2})
    assert (config.url, config.retention) == ("s3://b", {"save_trial_best": 2})
    child = StorageConfig.parse(config.to_env())   # what a child process reads
    assert (child.url, child.retention) == (config.url, config.retention)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from ckptstore import defaults
from ckptstore.errors import InvalidStorageConfig
from ckptstore.jsonsafe import env_json_object
from ckptstore.storage_backends import open_storage, url_scheme
from ckptstore.storage_backends.base import Storage
from ckptstore.storage_backends.config import (
    DEDUP_KEY,
    dedup_option,
    parse_storage_config,
    split_storage_config,
)

__all__ = ["StorageConfig", "env_storage", "resolve"]


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """A storage spec parsed once, where it enters (an argument, ``CKPTSTORE_STORAGE``, a YAML
    ``checkpoint_storage`` block, a registry row): what every layer below receives.

    ``url`` and ``options`` open the storage; ``retention`` holds Determined's GC keys given with
    it (``save_trial_best``, ...), ``dedup`` its ``dedup`` key (None: the checkpoint context's
    default). ``block`` is the Determined dict's storage keys as given (None for a URL), kept so
    :meth:`to_env` hands a child process the same dict. ``instance`` is a ``Storage`` the caller
    opened: :meth:`open` returns it and its owner closes it.

    Example::

        config = resolve({"type": "s3", "bucket": "b", "save_trial_best": 2})
        assert (config.url, config.retention) == ("s3://b", {"save_trial_best": 2})
        child = StorageConfig.parse(config.to_env())   # what a child process reads
        assert (child.url, child.retention) == (config.url, config.retention)
    """

    url: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    retention: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dedup: bool | None = None
    block: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False)
    instance: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, spec: Any) -> StorageConfig:
        """A URL or path, a ``checkpoint_storage`` dict, a JSON object of one (as
        :meth:`to_env` writes it), an open ``Storage`` or a StorageConfig (returned as is)."""
        if isinstance(spec, StorageConfig):
            return spec
        if isinstance(spec, Storage):
            return cls(url=spec.url, instance=spec)
        if isinstance(spec, str) and spec.strip().startswith("{"):
            spec = _json_block(spec.strip())
        if isinstance(spec, Mapping):
            storage, retention = split_storage_config(spec)
            dedup = dedup_option(spec)
            url, options = parse_storage_config(storage)
            return cls(url, options, retention, dedup, block=storage)
        if isinstance(spec, (str, os.PathLike)):
            return cls(url=os.fspath(spec))
        raise InvalidStorageConfig(
            "storage must be a URL, a path, a checkpoint_storage dict or a Storage. "
            f"Received: {type(spec).__name__}"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StorageConfig | None:
        """``CKPTSTORE_STORAGE`` (a URL, or a JSON ``checkpoint_storage`` object); None if unset."""
        raw = env_storage(environ)
        return None if raw is None else cls.parse(raw)

    def with_retention(self, keys: Mapping[str, int]) -> StorageConfig:
        """This storage with ``keys`` (Determined's GC keys) over its own."""
        return dataclasses.replace(self, retention={**self.retention, **keys})

    @property
    def spec(self) -> str | dict[str, Any]:
        """The spec as a URL, or as a ``checkpoint_storage`` dict when there is more to it
        (options, retention keys, ``dedup``): what a child process or a registry row gets."""
        if not (self.block or self.options or self.retention or self.dedup is not None):
            return self.url
        block = (
            dict(self.block) if self.block else {"type": "directory", "container_path": self.url}
        )
        block.update(self.retention)
        if self.dedup is not None:
            block[DEDUP_KEY] = self.dedup
        return block

    def to_env(self) -> str:
        """:attr:`spec` as a string: ``CKPTSTORE_STORAGE`` of a child process, a registry row."""
        spec = self.spec
        return spec if isinstance(spec, str) else json.dumps(spec)

    def open(self) -> Any:
        """The ``Storage`` (the caller's own :attr:`instance`, or a new one the caller closes)."""
        if self.instance is not None:
            return self.instance
        return open_storage(self.url, **self.options)

    def open_at(self, url: str) -> Storage:
        """A new ``Storage`` at ``url`` (a registry row's, once trusted) with this config's
        options (endpoint, credentials, transfer settings) when it is the same backend: a row
        picks a bucket, never an endpoint or a credential. Another backend gets none."""
        same = url_scheme(url) == url_scheme(self.url)
        return open_storage(url, **(self.options if same else {}))


def _json_block(raw: str) -> dict[str, Any]:
    """A ``checkpoint_storage`` object given as JSON text (``{...}``, so valid JSON is an
    object); the text is never quoted back: it may hold credentials."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidStorageConfig(
            "A storage spec starting with '{' must be a JSON checkpoint_storage object "
            f"({exc.msg} at character {exc.pos}). Write e.g. "
            '{"type": "s3", "bucket": "b"}, or give a URL.'
        ) from None


def env_storage(environ: Mapping[str, str] | None = None) -> str | dict[str, Any] | None:
    """``CKPTSTORE_STORAGE`` as a URL, or as a dict when it holds a JSON object; None if unset."""
    environ = os.environ if environ is None else environ
    raw = environ.get(defaults.STORAGE_ENV, "").strip()
    if not raw:
        return None
    return env_json_object(raw, defaults.STORAGE_ENV) if raw.startswith("{") else raw


def resolve(
    given: Any = None,
    *,
    fallback: Any = None,
    retention: Mapping[str, int] | None = None,
    environ: Mapping[str, str] | None = None,
) -> StorageConfig:
    """The one precedence rule of a storage spec: ``given`` (an argument), else ``fallback``
    (an experiment config's ``checkpoint_storage``), else ``CKPTSTORE_STORAGE``, else the
    default local folder. ``retention`` (a config's GC keys) joins whatever was chosen, under
    the keys the chosen spec gives itself."""
    for spec in (given, fallback):
        if spec is not None:
            config = StorageConfig.parse(spec)
            break
    else:
        config = StorageConfig.from_env(environ) or StorageConfig(defaults.default_storage_url())
    if retention:
        config = dataclasses.replace(config, retention={**retention, **config.retention})
    return config
