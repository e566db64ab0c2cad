"""Parsing ``scheme://bucket/prefix`` URLs without ever echoing credentials.

Example::

    from ckptstore.storage_backends.urls import split_bucket_url
    split_bucket_url("s3://ckpts/exp/1", "s3")   # ("ckpts", "exp/1")
"""

from __future__ import annotations

from urllib.parse import unquote

from ckptstore.errors import InvalidStorageConfig
from ckptstore.storage_backends.paths import check_key


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
