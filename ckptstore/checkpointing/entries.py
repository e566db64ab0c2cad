"""A manifest's file entries as typed values (issue 43): what ``MANIFEST.json`` says about one
file of a checkpoint, read through :class:`~ckptstore.checkpointing.format.Manifest`.

In JSON an entry is ``{"size": int, "crc32c": "8 hex digits"}``, plus, for a file stored as
content-addressed chunks (format 2), ``"blobs": [{"sha256": "64 hex digits", "size": int},
...]`` in file order. :meth:`FileEntry.of` reads that shape (already checked by
``Manifest.parse``, or a writer's own), :meth:`FileEntry.to_json` writes it back with the
same keys, so a manifest's bytes are unchanged.

Example::

    entry = FileEntry.of({"size": 3, "crc32c": "0a1b2c3d"})
    assert not entry.chunked and entry.to_json() == {"size": 3, "crc32c": "0a1b2c3d"}
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

_KEYS = frozenset({"size", "crc32c", "blobs"})


class Chunk(NamedTuple):
    """One content-addressed chunk of a file: its SHA-256 (the blob's name) and size.

    A tuple: a format 2 manifest of a large model lists ~260,000 of them, and a tuple is the
    cheapest immutable value to build while parsing."""

    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}


# Built without a Python-level call per chunk (a third faster on ~260,000 chunks).
_sha_and_size = operator.itemgetter("sha256", "size")
_chunk = functools.partial(tuple.__new__, Chunk)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a checkpoint: ``size`` in bytes, ``crc32c`` (8 lowercase hex digits) and,
    for a file stored as chunks, ``chunks`` (a tuple, maybe empty; None: stored whole).
    ``extra``: keys a later ckptstore may add to an entry, kept as read so a rewrite (a
    partial delete, an added file) carries them."""

    size: int
    crc32c: str
    chunks: tuple[Chunk, ...] | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def chunked(self) -> bool:
        """True when the file is stored as chunks (a list, maybe empty), not whole."""
        return self.chunks is not None

    @classmethod
    def of(cls, entry: FileEntry | Mapping[str, Any]) -> FileEntry:
        """``entry`` itself, or the entry its JSON object describes."""
        if isinstance(entry, FileEntry):
            return entry
        blobs = entry.get("blobs")
        chunks = None if blobs is None else tuple(map(_chunk, map(_sha_and_size, blobs)))
        extra = (
            ()
            if entry.keys() <= _KEYS
            else tuple(sorted((k, entry[k]) for k in entry.keys() - _KEYS))
        )
        return cls(entry["size"], entry["crc32c"], chunks, extra)

    def to_json(self) -> dict[str, Any]:
        """The entry's JSON object (a new dict), as every ckptstore wrote it."""
        out: dict[str, Any] = {"size": self.size, "crc32c": self.crc32c}
        if self.chunks is not None:
            out["blobs"] = [{"sha256": sha, "size": size} for sha, size in self.chunks]
        out.update(self.extra)
        return out


__all__ = ["Chunk", "FileEntry"]
