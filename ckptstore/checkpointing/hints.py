"""What a writer knows about the files it put in a ``store_path()`` folder, as one typed value.

Example::

    from ckptstore.checkpointing import CheckpointContext, CommitHints

    ctx = CheckpointContext("/tmp/ckpts")
    hints = CommitHints()
    with ctx.store_path({"steps_completed": 1}, hints=hints) as (path, uuid):
        (path / "weights.bin").write_bytes(b"\\0" * 16)
        hints.checksums["weights.bin"] = "d1e2b3f4"   # only if computed while writing
"""

from __future__ import annotations

import dataclasses

__all__ = ["CommitHints"]


@dataclasses.dataclass
class CommitHints:
    """Filled by the writer until the ``store_path()`` block exits, read at the commit.

    ``checksums``: ``{relpath: crc32c}`` (8 hex digits) of files checksummed while written, so
    the manifest does not read them again. ``cuts``: ``{relpath: [offset, ...]}``, where the
    pieces of a file (its tensors) begin and end, so a deduplicated commit cuts its chunks there
    and a changed tensor costs its own bytes. Both are ignored by sharded checkpoints."""

    checksums: dict[str, str] = dataclasses.field(default_factory=dict)
    cuts: dict[str, list[int]] = dataclasses.field(default_factory=dict)
