"""Determined's Core API on ckptstore: ``import ckptstore as det; det.core.init(...)``.

A facade: the code lives in :mod:`ckptstore.keras_io`. Importing this module does not import
TensorFlow (``DistributedContext.from_tf_config()`` imports it when called).

Example::

    import ckptstore as det

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed, storage="s3://bucket/ckpts") as core_context:
        main(core_context, strategy)
"""

from __future__ import annotations

from ckptstore.keras_io.core_context import Context, init
from ckptstore.keras_io.distributed import DistributedContext
from ckptstore.keras_io.preempt import PreemptContext
from ckptstore.keras_io.train_context import TrainContext
from ckptstore.keras_io.trial_info import ClusterInfo, TrialInfo, get_cluster_info, get_trial_info

__all__ = [
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "PreemptContext",
    "TrainContext",
    "TrialInfo",
    "get_cluster_info",
    "get_trial_info",
    "init",
]
