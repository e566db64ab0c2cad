"""Small file trees on local disk: write ``{relpath: bytes}`` and read it back."""

from __future__ import annotations

import os


def make_tree(root: str | os.PathLike[str], files: dict[str, bytes]) -> str:
    """Write ``{relpath: bytes}`` under ``root`` (created); returns ``root`` as a string."""
    os.makedirs(root, exist_ok=True)
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return str(root)


def read_tree(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """``{relpath: bytes}`` of every file under ``root`` (names the OS gives as bytes are decoded
    the way Python decodes file names, so no name is lost)."""
    out = {}
    base = os.fsencode(root)
    for folder, _dirs, names in os.walk(base):
        for name in names:
            full = os.path.join(folder, name)
            rel = os.fsdecode(os.path.relpath(full, base)).replace(os.sep, "/")
            with open(full, "rb") as f:
                out[rel] = f.read()
    return out
