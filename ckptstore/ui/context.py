"""What every page handler shares: the registry, storages opened once per URL, the templates,
and the translation of ckptstore errors into HTTP statuses.

Example::

    ui = UiContext(settings)
    html = ui.render(request, "models.html", page=page)
"""

from __future__ import annotations

import collections
import datetime as _dt
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ckptstore import errors, masking
from ckptstore.checkpointing.row_storage import storage_of_row
from ckptstore.registry import Registry
from ckptstore.storage_backends.base import Storage, close_all
from ckptstore.ui.settings import UiSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TEMPLATES = Path(__file__).parent / "templates"
#: Rendered chart sets kept in memory (one per experiment and metric version).
CACHE_ENTRIES = 32


def safe_url(url: str | None) -> str:
    """A storage or registry URL as a page may show it (:func:`ckptstore.masking.mask_text`)."""
    return masking.mask_text(str(url)) if url else ""


def safe_config(value: Any) -> Any:
    """``value`` (a config, metadata, hparams) as a page may show it
    (:func:`ckptstore.masking.mask_value`)."""
    return masking.mask_value(value)


def human_size(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def human_age(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3.0 h``, ``2.0 d`` (empty for None)."""
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, _dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def status_of(exc: Exception) -> int:
    """The HTTP status for a ckptstore error."""
    not_found = (
        errors.CheckpointNotFound,
        errors.TrialNotFound,
        errors.ExperimentNotFound,
        errors.ModelNotFound,
        errors.StorageNotFound,
    )
    if isinstance(exc, not_found):
        return 404
    if isinstance(exc, (errors.InvalidConfig, errors.InvalidStoragePath, ValueError)):
        return 400
    if isinstance(exc, errors.ModelVersionConflict):
        return 409
    return 500


class UiContext:
    """One per app: the open registry, storages by URL, and the Jinja2 environment."""

    def __init__(self, settings: UiSettings) -> None:
        self.settings = settings
        self.registry = Registry(settings.registry_url)
        self._storages: dict[str, Storage] = {}
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["fmt"] = _fmt
        self.env.filters["size"] = human_size
        self.env.filters["age"] = human_age
        self.env.filters["safe_url"] = safe_url
        self.env.globals["json"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)

    def storage(self, url: str | None = None) -> Storage:
        """The storage at ``url`` (a registry row's URL; default: ``--storage``), opened once;
        another URL gets ``--storage``'s options when it is the same backend."""
        key = url or self.settings.storage_url
        config = self.settings.storage
        assert config is not None  # UiSettings parses it
        with self._lock:
            if key not in self._storages:
                opened = config.open() if key == config.url else config.open_at(key)
                self._storages[key] = opened
            return self._storages[key]

    def storage_for(self, ckpt: Any) -> Storage:
        """The storage of a registry checkpoint row: an explicit ``--storage`` wins, else the
        URL the row recorded when :func:`~ckptstore.checkpointing.row_storage.storage_of_row`
        trusts it (it is the UI's storage or in ``CKPTSTORE_ALLOWED_STORAGE``), else the UI's
        storage."""
        if self.settings.explicit_storage:
            return self.storage()
        recorded = getattr(ckpt, "storage_url", "") or None
        uuid = getattr(ckpt, "uuid", None)
        return self.storage(storage_of_row(recorded, self.settings.storage_url, uuid=uuid))

    def cached(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, remembered under ``key`` (the newest :data:`CACHE_ENTRIES` kept). Keys
        carry a stamp of the data, so a change is never served stale."""
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        value = make()
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return value

    def render(
        self, request: Request, template: str, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        def link(**changes: Any) -> str:
            """This page's URL with some query parameters changed (None removes one)."""
            params = [(k, v) for k, v in request.query_params.multi_items() if k not in changes]
            for key, value in changes.items():
                if value is None:
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                params.extend((key, str(v)) for v in values)
            return request.url.path + ("?" + urlencode(params) if params else "")

        html = self.env.get_template(template).render(
            request=request,
            link=link,
            csrf=self.settings.csrf_secret,
            read_only=self.settings.read_only,
            registry_url=safe_url(self.registry.url),
            storage_url=safe_url(self.settings.storage_url),
            **ctx,
        )
        return HTMLResponse(html, status_code=status)

    def error(self, request: Request, exc: Exception) -> HTMLResponse:
        status = status_of(exc)
        if status == 500:
            logger.exception("UI request %s failed", request.url.path, exc_info=exc)
        return self.render(
            request,
            "error.html",
            status=status,
            status_code=status,
            message=masking.mask_text(str(exc)),
        )

    def close(self) -> None:
        close_all(self._storages.values())
        self._storages.clear()
        self.registry.close()
