"""Determined's Core API on ckptstore: ``import ckptstore as det; det.core.init(...)``.

The public list of names; the code lives in private modules beside this file. Importing this
module does not import TensorFlow (``DistributedContext.from_tf_config()`` imports it when called).

Example::

    import ckptstore as det

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed, storage="s3://bucket/ckpts") as core_context:
        main(core_context, strategy)
"""

from __future__ import annotations

from ckptstore.checkpointing import CheckpointContext, DownloadMode
from ckptstore.core._context import Context, init
from ckptstore.core._distributed import DistributedContext, DummyDistributedContext
from ckptstore.core._info import ClusterInfo, TrialInfo, get_cluster_info, get_trial_info
from ckptstore.core._modes import PreemptMode, TensorboardMode
from ckptstore.core._preempt import PreemptContext
from ckptstore.core._searcher import (
    DummySearcherContext,
    DummySearcherOperation,
    SearcherContext,
    SearcherContextMissing,
    SearcherMode,
    SearcherOperation,
    Unit,
)
from ckptstore.core._train import EarlyExitReason, TrainContext

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "DummySearcherContext",
    "DummySearcherOperation",
    "EarlyExitReason",
    "PreemptContext",
    "PreemptMode",
    "TensorboardMode",
    "SearcherContext",
    "SearcherContextMissing",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "TrialInfo",
    "Unit",
    "get_cluster_info",
    "get_trial_info",
    "init",
]
