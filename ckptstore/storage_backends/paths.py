"""Key validation, joining and selection helpers shared by every backend.

A *key* is a ``/``-separated path relative to a storage prefix. :func:`check_key` rejects keys
that could escape the prefix or that object stores and file systems disagree on.

Example::

    from ckptstore.storage_backends.paths import check_key, join_key
    check_key("ckpts/0b7c/")        # -> "ckpts/0b7c"
    join_key("ckpts", "model.keras")  # -> "ckpts/model.keras"
    check_key("../etc/passwd")      # raises InvalidStoragePath
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

from ckptstore.errors import InvalidStoragePath

__all__ = ["check_key", "check_relpath", "join_key", "compile_selector", "matches_any"]


def _reject(key: object, why: str) -> InvalidStoragePath:
    return InvalidStoragePath(
        f"Invalid storage key {key!r}: {why}. Use a relative '/'-separated path such as "
        "'checkpoints/0b7c/model.keras'."
    )


def check_key(key: str, *, allow_empty: bool = True) -> str:
    """Validate ``key`` and return it normalized (one trailing ``/`` removed).

    Rejects ``..`` and ``.`` segments, absolute paths, backslashes, NUL and other control
    characters, and empty segments (``a//b``) with :class:`~ckptstore.errors.InvalidStoragePath`.
    ``""`` means the prefix itself and is allowed unless ``allow_empty`` is False.
    """
    if not isinstance(key, str):
        raise _reject(key, f"a key must be a str, got {type(key).__name__}")
    if key.endswith("/") and key != "/":
        key = key[:-1]
    if key == "":
        if not allow_empty:
            raise _reject(key, "the key is empty")
        return ""
    if key.startswith("/"):
        raise _reject(key, "absolute paths are not allowed")
    if "\\" in key:
        raise _reject(key, "backslashes are not allowed")
    if any(ord(c) < 32 or c == "\x7f" for c in key):
        raise _reject(key, "NUL and control characters are not allowed")
    if len(key) >= 2 and key[1] == ":" and key[0].isalpha():
        raise _reject(key, "drive letters are not allowed")
    for part in key.split("/"):
        if part == "":
            raise _reject(key, "empty path segments ('//' or a trailing '/') are not allowed")
        if part in (".", ".."):
            raise _reject(key, f"'{part}' segments are not allowed")
    return key


def check_relpath(relpath: str) -> str:
    """Like :func:`check_key` but for a file's path inside a tree: it may not be empty."""
    return check_key(relpath, allow_empty=False)


def join_key(*parts: str) -> str:
    """Join validated keys with ``/``, skipping empty ones."""
    return "/".join(p for p in parts if p)


def matches_any(relpath: str, globs: Iterable[str]) -> bool:
    """True if ``relpath`` matches one of ``globs``.

    Globs use :mod:`fnmatch` rules on the whole relative path (``*`` also crosses ``/``), and a
    glob that names a folder (``"optimizer/"`` or ``"optimizer"``) matches everything in it.
    """
    for pattern in globs:
        if fnmatch.fnmatchcase(relpath, pattern):
            return True
        folder = pattern.rstrip("/")
        if folder and relpath.startswith(folder + "/"):
            return True
    return False


def compile_selector(selector: object) -> Callable[[str], bool]:
    """Turn a selector (None, callable, one glob or several globs) into a predicate."""
    if selector is None:
        return lambda _relpath: True
    if callable(selector):
        return selector  # type: ignore[return-value]
    if isinstance(selector, str):
        globs: list[str] = [selector]
    else:
        try:
            globs = list(selector)  # type: ignore[call-overload]
        except TypeError:
            raise InvalidStoragePath(
                f"Invalid selector {selector!r}: pass a callable, a glob string or a list of "
                "globs such as ['*.keras', 'assets/*']."
            ) from None
        if not all(isinstance(g, str) for g in globs):
            raise InvalidStoragePath(f"Invalid selector {selector!r}: every glob must be a str.")
    return lambda relpath: matches_any(relpath, globs)
