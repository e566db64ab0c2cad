"""What every ``ckptstore`` verb shares: the storage and registry it was pointed at.

``--storage`` (or ``CKPTSTORE_STORAGE``) is parsed once, by :class:`StorageParam`, into a
:class:`~ckptstore.storage_backends.spec.StorageConfig`: a bad value is a usage error (exit 2)
carrying the typed ``InvalidStorageConfig`` message, before any verb runs. Storage and registry
are opened lazily (a verb that needs only the registry never touches storage) and closed when
the command ends.

Example::

    from ckptstore.storage_backends.spec import resolve

    state = CliState(storage=resolve("/tmp/ckpts"), registry_url="sqlite:////tmp/reg.db")
    registry = state.registry()
    storage = state.storage()
    state.close()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click

from ckptstore import defaults

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.registry import Registry
    from ckptstore.storage_backends.base import Storage
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)


class StorageParam(click.ParamType):
    """A storage spec (a URL, a path, or a JSON ``checkpoint_storage`` object, as
    ``CKPTSTORE_STORAGE`` may hold) parsed by the one
    :func:`~ckptstore.storage_backends.spec.resolve` into a ``StorageConfig``; a bad one is a
    usage error naming the typed error (``InvalidStorageConfig: ...``)."""

    name = "storage"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ckptstore.errors import InvalidStorageConfig
        from ckptstore.storage_backends import check_storage_spec
        from ckptstore.storage_backends.spec import StorageConfig, resolve

        if isinstance(value, StorageConfig):
            return value
        try:
            config = resolve(value)
            check_storage_spec(config.url)  # "" or "s3:/x" must not become a local folder
        except InvalidStorageConfig as exc:
            self.fail(f"{type(exc).__name__}: {exc}", param, ctx)
        return config


class CliState:
    """Lazily opened storage(s) and registry for one command invocation.

    Example::

        state = CliState(storage=None, registry_url=None)  # env vars / defaults
        print(state.storage_url)
    """

    def __init__(
        self, storage: StorageConfig | None = None, registry_url: str | None = None
    ) -> None:
        from ckptstore.storage_backends.spec import resolve

        #: True when --storage (or CKPTSTORE_STORAGE) named the storage: it then wins over
        #: the URL a registry row recorded.
        self.explicit_storage = storage is not None
        #: ``--storage`` as parsed at the edge (else ``CKPTSTORE_STORAGE``, else the default).
        self.storage_config = storage if storage is not None else resolve()
        self.registry_url = registry_url or defaults.default_registry_url()
        self._registry: Registry | None = None
        self._storages: dict[str, Storage] = {}

    @property
    def storage_url(self) -> str:
        """The URL of :attr:`storage_config`."""
        return self.storage_config.url

    def registry(self) -> Registry:
        """The registry (opened, and migrated, on first use)."""
        if self._registry is None:
            from ckptstore.registry import Registry

            self._registry = Registry(self.registry_url)
        return self._registry

    def storage(self, url: str | None = None) -> Storage:
        """The storage at ``url`` (default: ``--storage``), opened once per URL; another URL
        (a trusted registry row's) gets ``--storage``'s options when it is the same backend."""
        key = url or self.storage_url
        if key not in self._storages:
            config = self.storage_config
            opened = config.open() if key == config.url else config.open_at(key)
            self._storages[key] = opened
        return self._storages[key]

    def storage_for(self, record: Any, *, follow: bool = False) -> Storage:
        """The storage of a registry checkpoint row: ``--storage`` when it was given (an
        explicit choice always wins, with a warning when the row recorded another URL), else
        the row's own URL when :func:`~ckptstore.checkpointing.row_storage.storage_of_row`
        trusts it (under the default storage or ``CKPTSTORE_ALLOWED_STORAGE``; ``follow``: a
        download for the user also follows S3/GCS/Azure bucket URLs), else the default."""
        recorded = getattr(record, "storage_url", "") or None
        if self.explicit_storage:
            storage = self.storage()
            if recorded and recorded not in (self.storage_url, storage.url):
                logger.warning(
                    "Using --storage %s for checkpoint %s; the registry recorded it in %s.",
                    storage.url,
                    getattr(record, "uuid", "?"),
                    recorded,
                )
            return storage
        from ckptstore.checkpointing.row_storage import storage_of_row

        uuid = getattr(record, "uuid", None)
        return self.storage(storage_of_row(recorded, self.storage_url, uuid=uuid, follow=follow))

    def close(self) -> None:
        """Close everything opened; errors while closing are logged, not raised."""
        from ckptstore.storage_backends.base import close_all

        close_all(self._storages.values())
        self._storages.clear()
        if self._registry is not None:
            try:
                self._registry.close()
            except Exception:  # noqa: BLE001
                logger.debug("closing the registry failed", exc_info=True)
            self._registry = None


#: Decorator handing a verb the ``CliState`` that ``ckptstore``'s top-level group created.
pass_state = click.make_pass_decorator(CliState)
