"""Bounded reading of the JSON files a checkpoint holds (``MANIFEST.json``, ``metadata.json``,
callback state, Determined's ``load_data.json``, ...): size and nesting depth are checked before
parsing, and every failure is a typed :class:`~ckptstore.errors.InvalidCheckpoint`. Re-exported
by :mod:`ckptstore.checkpointing.format`."""

from __future__ import annotations

import json
import re
from typing import Any

from ckptstore import errors

#: The default size limit of :func:`read_json_file`: the manifest's
#: (:data:`ckptstore.checkpointing.format.MAX_MANIFEST_BYTES`).
MAX_JSON_BYTES = 128 * 2**20

_DAMAGED = "the checkpoint is damaged or was not written by ckptstore; do not load it"

#: The deepest nesting a checkpoint's JSON files may have (ckptstore writes at most ~10
#: levels; a callback's own state a few more). Deeper is refused before parsing: Python's
#: parser would raise RecursionError (or, in a thread with a small stack, crash).
MAX_JSON_DEPTH = 200
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def load_json(data: bytes | str, where: str, max_bytes: int) -> Any:
    """Parse a JSON file a checkpoint holds, bounded: over ``max_bytes`` bytes or
    :data:`MAX_JSON_DEPTH` levels, or not JSON, raises
    :class:`~ckptstore.errors.InvalidCheckpoint` naming ``where`` (never RecursionError or
    unbounded memory). The one reader of every such file."""
    if len(data) > max_bytes:
        raise refuse(where, f"has {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise refuse(where, f"is not UTF-8 ({str(exc)[:200]})") from None
    depth = deepest = 0
    for char in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):  # in C; then few chars
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                raise refuse(where, f"nests values over {MAX_JSON_DEPTH} levels deep")
        elif char in "]}":
            depth -= 1
    try:
        return json.loads(text)
    # ValueError: also an int literal of over 4300 digits; RecursionError: deep nesting.
    except (ValueError, RecursionError) as exc:
        raise refuse(where, f"is not valid JSON ({str(exc)[:200]})") from None


def read_json_file(path: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file of a local checkpoint folder (``optimizers.json``, Determined's
    ``load_data.json``, a model config, ...), read as :func:`load_json` reads stored ones: at
    most ``max_bytes + 1`` bytes are read, and size, depth and syntax errors are
    InvalidCheckpoint naming ``path``. OSError (a missing file) is the caller's."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    return load_json(data, path, max_bytes)


def refuse(where: str, what: str) -> errors.InvalidCheckpoint:
    return errors.InvalidCheckpoint(f"{where} {what}; {_DAMAGED}.")
