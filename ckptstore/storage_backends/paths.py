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
import unicodedata
from collections.abc import Callable, Iterable

from ckptstore.errors import InvalidStoragePath

__all__ = [
    "check_key",
    "check_relpath",
    "key_problem",
    "join_key",
    "compile_selector",
    "matches_any",
]

#: The longest path segment (file or folder name) in UTF-8 bytes: ext4, XFS, APFS and NTFS all
#: stop at 255, so a longer name could be written to one storage and never copied to another.
MAX_SEGMENT_BYTES = 255
#: The longest key in UTF-8 bytes: S3, GCS and Azure object names stop at 1024.
MAX_KEY_BYTES = 1024


def _reject(key: object, why: str) -> InvalidStoragePath:
    return InvalidStoragePath(
        f"Invalid storage key {key!r}: {why}. Use a relative '/'-separated path such as "
        "'checkpoints/0b7c/model.keras'."
    )


def check_key(key: str, *, allow_empty: bool = True) -> str:
    """Validate ``key`` and return it normalized (one trailing ``/`` removed).

    This is the one rule for every key and every file inside a checkpoint: writers check each
    file with it before anything is committed, and readers check each manifest entry with it.
    Rejects ``..`` and ``.`` segments, absolute paths, backslashes, a leading drive letter
    (``C:``), control characters (Unicode category Cc: NUL, tab, newline, DEL, C1), text that
    is not valid UTF-8 (lone surrogates, e.g. undecodable file names), empty segments
    (``a//b``), segments over :data:`MAX_SEGMENT_BYTES` and keys over :data:`MAX_KEY_BYTES`
    UTF-8 bytes, with :class:`~ckptstore.errors.InvalidStoragePath`. ``""`` means the prefix
    itself and is allowed unless ``allow_empty`` is False.
    """
    if not isinstance(key, str):
        raise _reject(key, f"a key must be a str, got {type(key).__name__}")
    if key.endswith("/") and key != "/":
        key = key[:-1]
    why = key_problem(key, allow_empty=allow_empty)
    if why is not None:
        raise _reject(key, why)
    return key


def key_problem(key: str, *, allow_empty: bool = True) -> str | None:
    """Why ``key`` (already without its trailing ``/``) breaks the rule of :func:`check_key`,
    or None when it is fine."""
    if key == "":
        return None if allow_empty else "the key is empty"
    if key.startswith("/"):
        return "absolute paths are not allowed"
    if "\\" in key:
        return "backslashes are not allowed"
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in key):
        return "NUL, control characters and undecodable (non-UTF-8) names are not allowed"
    if len(key) >= 2 and key[1] == ":" and key[0].isalpha():
        return "drive letters are not allowed"
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        return f"keys may have at most {MAX_KEY_BYTES} UTF-8 bytes"
    for part in key.split("/"):
        if part == "":
            return "empty path segments ('//' or a trailing '/') are not allowed"
        if part in (".", ".."):
            return f"'{part}' segments are not allowed"
        if len(part.encode("utf-8")) > MAX_SEGMENT_BYTES:
            return f"names may have at most {MAX_SEGMENT_BYTES} UTF-8 bytes"
    return None


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
