"""Which storage a registry checkpoint row may send a reader to.

A registry row records the storage URL its checkpoint was written to. Whoever can write the
registry (a shared PostgreSQL database) can write any URL there: ``http://<internal host>/``
would make the UI send requests inside the network, ``s3://their-bucket/`` would load their
model. So a row's URL is used only when it is the storage the caller opened, or when it is in
an allow-list the caller gave; HTTP(S) is never a storage unless the caller named it.

A process loading a model for its own user (``load_checkpoint_model``, ``ckptstore checkpoint
download``, the SDK's ``Checkpoint.download``) passes ``follow=True``: a row naming an object
store whose URL names only a bucket or container (``s3://``, ``gs://``, ``az://`` and their
aliases, see :data:`FOLLOWED_SCHEMES`) is then read with the caller's own credentials and
endpoint settings: the row picks a bucket, never a host, an endpoint or a credential (a URL
with ``user@``, ``?`` or ``#`` is not followed). Local paths, HTTP(S) and every other scheme
are still read only when opened or allowed, and the UI and servers never pass ``follow``.
docs/how-to/trust.md states the whole threat model.

The allow-list is the ``allowed=`` argument or the ``CKPTSTORE_ALLOWED_STORAGE`` environment
variable: URL prefixes separated by commas or whitespace (``s3://team-ckpts,
gs://archive/old``); a prefix allows itself and what is below it (``s3://b`` allows
``s3://b/x``, not ``s3://bb``); ``*`` allows any storage that is not HTTP(S).

Example::

    from ckptstore.checkpointing.row_storage import storage_of_row

    storage_of_row("s3://ckpts/exp", opened="s3://ckpts/exp")          # 's3://ckpts/exp'
    storage_of_row(None, opened="/mnt/ckpts")                          # None: use the opened one
    storage_of_row("http://10.0.0.5/", opened="/mnt/ckpts")            # StorageNotAllowed
    storage_of_row("gs://old/c", opened="/mnt/ckpts", allowed=["gs://old"])  # 'gs://old/c'
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from ckptstore import errors
from ckptstore.masking import mask_text
from ckptstore.storage_backends.local import local_root_from_url
from ckptstore.storage_backends.spec import StorageConfig

__all__ = [
    "ALLOWED_STORAGE_ENV",
    "FOLLOWED_SCHEMES",
    "allowed_from_env",
    "is_under",
    "open_row_storage",
    "storage_of_row",
]

#: Environment variable with the allow-list of storage URL prefixes (see the module docstring).
ALLOWED_STORAGE_ENV = "CKPTSTORE_ALLOWED_STORAGE"
_HTTP = ("http", "https")
#: Schemes a ``follow=True`` reader follows: object stores whose URL names a bucket/container
#: only; the endpoint, account and credentials come from the caller's own settings.
FOLLOWED_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def _canonical(url: str) -> str:
    """``url`` in the form storages report it: local paths as ``file:///abs``, lower-case
    scheme, no trailing ``/``."""
    match = _SCHEME.match(url)
    if match is None or match.group(1).lower() in ("file", "local"):
        try:
            return "file://" + local_root_from_url(url).rstrip("/")
        except errors.InvalidStorageConfig:
            return url
    return match.group(1).lower() + url[len(match.group(1)) :].rstrip("/")


def _scheme(url: str) -> str:
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else "file"


def _under(url: str, prefix: str) -> bool:
    return url == prefix or url.startswith(prefix + "/")


def is_under(url: str, storage: str) -> bool:
    """Whether storage URL ``url`` is ``storage`` or below it (``s3://b/x`` is under
    ``s3://b``, ``s3://bb`` is not; local paths compared as absolute ``file://`` URLs)."""
    return _under(_canonical(url), _canonical(storage))


def allowed_from_env() -> list[str]:
    """The URL prefixes of ``CKPTSTORE_ALLOWED_STORAGE`` (empty when unset)."""
    return [p for p in re.split(r"[,\s]+", os.environ.get(ALLOWED_STORAGE_ENV, "")) if p]


def _followable(url: str) -> bool:
    """A bucket URL of a followed scheme that carries no user, query or fragment."""
    if _scheme(url) not in FOLLOWED_SCHEMES:
        return False
    rest = url.split("://", 1)[1]
    bucket = rest.split("/", 1)[0]
    return bool(bucket) and not any(c in rest for c in "@?#") and ":" not in bucket


def storage_of_row(
    recorded: str | None,
    opened: str | Iterable[str],
    *,
    allowed: Iterable[str] | None = None,
    uuid: str | None = None,
    follow: bool = False,
) -> str | None:
    """The storage URL to read a registry row's checkpoint from: None when the row recorded
    none (read from ``opened``), else ``recorded`` when it is (under) an ``opened`` storage
    URL or an ``allowed`` prefix (default: :func:`allowed_from_env`).

    Raises :class:`~ckptstore.errors.StorageNotAllowed` naming the row's URL (masked) and how
    to allow it otherwise, and always for an HTTP(S) URL that neither ``opened`` nor
    ``allowed`` names explicitly (``*`` does not cover HTTP). With ``follow=True`` (a user's
    own load) a bucket URL of :data:`FOLLOWED_SCHEMES` is returned too.
    """
    if not recorded:
        return None
    url = _canonical(recorded)
    trusted = [_canonical(u) for u in ([opened] if isinstance(opened, str) else opened) if u]
    prefixes = list(allowed_from_env() if allowed is None else allowed)
    if any(_under(url, t) for t in trusted):
        return recorded
    named = [_canonical(p) for p in prefixes if p != "*"]
    if any(_under(url, p) for p in named):
        return recorded
    if "*" in prefixes and _scheme(url) not in _HTTP:
        return recorded
    if follow and _followable(recorded):
        return recorded
    shown = mask_text(recorded)
    what = f"Checkpoint {uuid}" if uuid else "A checkpoint"
    http = " HTTP(S) is never a storage unless named explicitly." if _scheme(url) in _HTTP else ""
    raise errors.StorageNotAllowed(
        f"{what} has a registry row naming the storage {shown}, which is not the storage "
        f"opened here ({', '.join(mask_text(t) for t in trusted) or 'none'}) nor in the "
        f"allow-list: a registry row does not choose where models are read from.{http} If "
        f"that storage is yours, pass it as the storage (storage= / --storage) or allow it: "
        f"{ALLOWED_STORAGE_ENV}={shown} (URL prefixes, comma-separated). "
        f"Received: storage_url={shown!r}"
    )


def open_row_storage(config: StorageConfig, recorded: str | None, *, follow: bool = False) -> Any:
    """A new ``Storage`` for a checkpoint a registry row recorded at ``recorded`` when
    :func:`storage_of_row` trusts that URL (under ``config``'s, allowed, or followed), else for
    ``config``; the caller closes it."""
    url = storage_of_row(recorded, config.url, follow=follow)
    return config.open_at(url) if url is not None else config.open()
