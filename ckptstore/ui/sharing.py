"""What a checkpoint shares with the one before it: per file, the bytes whose content the
previous checkpoint of the trial already had. In a deduplicated checkpoint (format 2) those
are chunks stored once for both; in a whole-file checkpoint they are identical files stored
again (the page says which).

Example::

    shared = shared_with(manifest, previous_manifest)
    print(shared.shared, "of", shared.total, "bytes")
"""

from __future__ import annotations

import dataclasses

from ckptstore.checkpointing.format import Manifest


@dataclasses.dataclass
class Sharing:
    """``files``: ``{relpath: bytes shared}``; ``deduplicated``: whether shared bytes are
    stored once (chunks) or again (whole files)."""

    files: dict[str, int]
    shared: int
    total: int
    deduplicated: bool


def shared_with(manifest: Manifest, previous: Manifest) -> Sharing:
    """The bytes of ``manifest``'s files whose content ``previous`` already held."""
    before_chunks = previous.blobs()
    before_files = previous.files
    files: dict[str, int] = {}
    deduplicated = False
    for rel, entry in manifest.files.items():
        if rel.endswith("/"):
            continue
        if entry.chunked:
            deduplicated = True
            files[rel] = sum(c.size for c in entry.chunks or () if c.sha256 in before_chunks)
        else:
            old = before_files.get(rel)
            same = old is not None and (old.size, old.crc32c) == (entry.size, entry.crc32c)
            files[rel] = entry.size if same else 0
    total = sum(e.size for r, e in manifest.files.items() if not r.endswith("/"))
    return Sharing(files, sum(files.values()), total, deduplicated)
