"""Plain objects the registry hands out: experiments, trials, metric rows and checkpoints.

They are snapshots: changing an attribute does not write to the database; use the
:class:`~ckptstore.registry.Registry` methods for that.

Example::

    from ckptstore.registry import Registry

    with Registry() as registry:
        ckpt = registry.latest_checkpoint(trial_id=1)
        if ckpt is not None:
            print(ckpt.uuid, ckpt.steps_completed, ckpt.metrics)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from typing import Any

from ckptstore.checkpointing.index import CheckpointRecord

#: States a trial or experiment can be in (Determined's names).
RUN_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR")


@dataclasses.dataclass
class Experiment:
    """A group of trials, with the experiment config they were launched from."""

    id: int
    name: str | None
    config: dict[str, Any]
    description: str | None
    state: str
    created_at: _dt.datetime
    updated_at: _dt.datetime


@dataclasses.dataclass
class Trial:
    """One training run: its hyperparameters and state."""

    id: int
    experiment_id: int | None
    hparams: dict[str, Any]
    state: str
    created_at: _dt.datetime
    updated_at: _dt.datetime


@dataclasses.dataclass
class MetricRow:
    """Metrics reported by a trial at ``steps_completed`` in ``group``
    (``"training"``, ``"validation"`` or any other name)."""

    trial_id: int
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    reported_at: _dt.datetime


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint as the registry knows it (Determined SDK's ``Checkpoint`` fields).

    ``resources`` is ``{relpath: size}``; ``state`` is one of PENDING, COMMITTED,
    PARTIALLY_DELETED, DELETED.
    """

    uuid: str
    trial_id: int | None
    experiment_id: int | None
    steps_completed: int
    continue_id: Any
    metadata: dict[str, Any]
    metrics: dict[str, Any]
    resources: dict[str, int]
    state: str
    storage_url: str
    created_at: _dt.datetime
    updated_at: _dt.datetime | None = None

    def to_record(self) -> CheckpointRecord:
        """This checkpoint as the :class:`CheckpointRecord` the checkpointing layer uses."""
        return CheckpointRecord(
            uuid=self.uuid,
            trial_id=self.trial_id,
            experiment_id=self.experiment_id,
            steps_completed=self.steps_completed,
            continue_id=self.continue_id,
            state=self.state,
            metadata=dict(self.metadata),
            metrics=dict(self.metrics),
            resources=dict(self.resources),
            storage_url=self.storage_url,
            created_at=self.created_at,
        )


def lookup_metric(metrics: dict[str, Any], name: str) -> float | None:
    """Find metric ``name`` in a checkpoint's metrics, or None.

    Looked up, in order: ``metrics[name]`` (flat form), ``metrics["validation_metrics"][name]``
    (Determined's nested form) -- the same order GC's
    :func:`ckptstore.checkpointing.gc.metric_value` uses -- then, as a fallback,
    ``metrics[<any other nested dict>][name]`` (e.g. ``training_metrics``). Only finite
    numbers count (not booleans, NaN or infinities).
    """

    def number(value: Any) -> float | None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            return value if math.isfinite(value) else None
        return None

    found = number(metrics.get(name))
    if found is not None:
        return found
    nested = metrics.get("validation_metrics")
    if isinstance(nested, dict) and number(nested.get(name)) is not None:
        return number(nested[name])
    for key, value in metrics.items():
        if key != "validation_metrics" and isinstance(value, dict):
            found = number(value.get(name))
            if found is not None:
                return found
    return None
