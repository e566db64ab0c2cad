"""``ckptstore.experimental``: Determined's ``determined.experimental`` namespace -- the SDK
``client`` over ckptstore's registry and storage, its classes, and ``experimental.keras``.

Example::

    from ckptstore.experimental import client

    client.get_checkpoint(uuid).download("/tmp/ckpt")
"""

from __future__ import annotations

from ckptstore.experimental import client
from ckptstore.experimental._determined import Determined
from ckptstore.experimental._native import test_one_batch
from ckptstore.experimental.client import (
    Checkpoint,
    Experiment,
    Model,
    ModelOrderBy,
    ModelSortBy,
    ModelVersion,
    OrderBy,
    Trial,
    TrialOrderBy,
    TrialSortBy,
)

#: Determined's older names for the same classes.
ExperimentReference = Experiment
TrialReference = Trial

__all__ = [
    "Checkpoint",
    "Determined",
    "Experiment",
    "ExperimentReference",
    "Model",
    "ModelOrderBy",
    "ModelSortBy",
    "ModelVersion",
    "OrderBy",
    "Trial",
    "TrialOrderBy",
    "TrialReference",
    "TrialSortBy",
    "client",
    "test_one_batch",
]
