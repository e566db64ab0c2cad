"""Parsing ``scheme://bucket/prefix`` URLs without ever echoing credentials.

Example::

    from ckptstore.storage_backends.urls import split_bucket_url
    split_bucket_url("s3://ckpts/exp/1", "s3")   # ("ckpts", "exp/1")
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from ckptstore.errors import InvalidStorageConfig
from ckptstore.storage_backends.paths import check_key

_SCHEME_WITHOUT_SLASHES = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):(?!//)")


def check_storage_spec(spec: str) -> str:
    """Refuse a storage URL that is empty, has surrounding whitespace, or looks like a mistyped
    URL (``s3:/bucket``, ``gs:bucket``: a scheme without ``//``); returns ``spec``.

    Without this such a spec would silently become a local folder (``./s3:/bucket``) or the
    default location. ``file:/path`` is accepted (a local path); a local folder whose name has
    a colon can be given as ``./name:x``.
    """
    if not spec.strip():
        raise InvalidStorageConfig(
            f"The storage URL is empty. Received: {spec!r}. Pass e.g. s3://bucket/prefix or "
            "/mnt/checkpoints, or leave --storage/storage= out for the default."
        )
    if spec != spec.strip():
        raise InvalidStorageConfig(
            f"The storage URL has leading or trailing whitespace. Received: {spec!r}. Remove "
            "it (check the quoting in your shell or config)."
        )
    match = _SCHEME_WITHOUT_SLASHES.match(spec)
    if match and match.group(1).lower() != "file":
        scheme = match.group(1)
        raise InvalidStorageConfig(
            f"The storage URL {spec!r} looks like a mistyped URL: '{scheme}:' without '//'. "
            f"Write {scheme}://bucket/prefix, or ./{spec} for a local folder of that name."
        )
    return spec


def split_bucket_url(url: str, scheme: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``scheme://bucket/prefix``; the prefix is validated like a key.

    URLs carrying ``user:password@`` are rejected (without repeating them): pass credentials
    as options instead.
    """
    if "://" not in url:
        raise InvalidStorageConfig(f"Expected a {scheme}://bucket/prefix URL. Received: {url!r}")
    rest = url.split("://", 1)[1]
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise InvalidStorageConfig(
            f"{scheme}:// URLs may not carry credentials or ports in the bucket part; pass "
            "credentials and endpoint_url as storage options instead."
        )
    if not bucket:
        raise InvalidStorageConfig(
            f"The {scheme}:// URL {url!r} has no bucket; use {scheme}://bucket/prefix."
        )
    prefix = unquote(prefix).strip("/")
    try:
        prefix = check_key(prefix)
    except ValueError as exc:
        raise InvalidStorageConfig(f"Invalid prefix in {scheme}://{bucket}/...: {exc}") from None
    return bucket, prefix
