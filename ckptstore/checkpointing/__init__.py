"""Checkpoints that are never half-written: the format, the commit protocol, background and
sharded uploads, retention (GC) and the collectives they need.

Example::

    from ckptstore.checkpointing import CheckpointContext, GCPolicy

    ctx = CheckpointContext("s3://bucket/ckpts", trial_id=1,
                            gc_policy=GCPolicy.from_determined(metric="val_loss"))
    uuid = ctx.upload("/tmp/ckpt", {"steps_completed": 100}, background=True)
    ctx.wait()
"""

from __future__ import annotations

from ckptstore.checkpointing.cache import RestoreCache
from ckptstore.checkpointing.context import CheckpointContext
from ckptstore.checkpointing.distributed import DummyDistributed, ProcessGroup
from ckptstore.checkpointing.download_mode import DownloadMode
from ckptstore.checkpointing.entries import Chunk, FileEntry
from ckptstore.checkpointing.format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    METADATA_NAME,
    Manifest,
    build_manifest,
    is_committed,
    load_manifest,
    read_manifest,
    verify_files,
)
from ckptstore.checkpointing.hints import CommitHints
from ckptstore.checkpointing.index import (
    COMMITTED,
    DELETED,
    PARTIALLY_DELETED,
    PENDING,
    CheckpointIndex,
    CheckpointRecord,
)
from ckptstore.checkpointing.metadata import read_metadata
from ckptstore.checkpointing.restore import DownloadReport
from ckptstore.checkpointing.retention import (
    AnyOf,
    BestN,
    ExperimentBestN,
    GCPolicy,
    KeepAll,
    LatestN,
)
from ckptstore.checkpointing.scan import list_committed, scan_checkpoints

__all__ = [
    "CommitHints",
    "DownloadMode",
    "DownloadReport",
    "AnyOf",
    "BestN",
    "COMMITTED",
    "CheckpointContext",
    "CheckpointIndex",
    "CheckpointRecord",
    "Chunk",
    "DELETED",
    "ProcessGroup",
    "DummyDistributed",
    "ExperimentBestN",
    "FORMAT_VERSION",
    "FileEntry",
    "GCPolicy",
    "KeepAll",
    "LatestN",
    "MANIFEST_NAME",
    "METADATA_NAME",
    "Manifest",
    "PARTIALLY_DELETED",
    "PENDING",
    "RestoreCache",
    "build_manifest",
    "is_committed",
    "list_committed",
    "load_manifest",
    "read_manifest",
    "read_metadata",
    "scan_checkpoints",
    "verify_files",
]
