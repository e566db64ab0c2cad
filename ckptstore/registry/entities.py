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
from typing import Any

from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.checkpointing.metrics import metric_value

#: States a trial or experiment can be in (Determined's names).
RUN_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR")
#: How often the chief of a running ``core.init`` context records that its process is alive
#: (one small UPDATE: cheap on the registry at this rate).
HEARTBEAT_SECONDS = 30.0
#: An ACTIVE trial whose heartbeat is older than this lost its process without saying so
#: (killed, machine gone): five missed heartbeats, so a slow registry is not mistaken for it.
LOST_AFTER_SECONDS = 5 * HEARTBEAT_SECONDS
#: The status of an ACTIVE trial whose process is gone (shown; never stored as a state).
LOST = "LOST"


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
    #: When its process last said it is alive (None: never, e.g. written by an older version).
    heartbeat_at: _dt.datetime | None = None

    def heartbeat_age(self, now: _dt.datetime | None = None) -> float | None:
        """Seconds since the last heartbeat, or None if there was none."""
        return heartbeat_age(self.heartbeat_at, now)

    @property
    def status(self) -> str:
        """The state, or :data:`LOST` for an ACTIVE trial whose process stopped sending
        heartbeats (what the CLI and the UI show)."""
        return trial_status(self.state, self.heartbeat_at)


def heartbeat_age(
    heartbeat_at: _dt.datetime | None, now: _dt.datetime | None = None
) -> float | None:
    """Seconds from ``heartbeat_at`` (timezone-aware UTC) to ``now`` (default: now)."""
    if heartbeat_at is None:
        return None
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return max(0.0, (now - heartbeat_at).total_seconds())


def trial_status(
    state: str, heartbeat_at: _dt.datetime | None, now: _dt.datetime | None = None
) -> str:
    """The one rule for "lost": ACTIVE with a heartbeat older than :data:`LOST_AFTER_SECONDS`.
    No heartbeat at all says nothing (a row from before heartbeats), so it stays ACTIVE."""
    age = heartbeat_age(heartbeat_at, now)
    if state == "ACTIVE" and age is not None and age > LOST_AFTER_SECONDS:
        return LOST
    return state


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
class Checkpoint(CheckpointRecord):
    """A checkpoint as the registry knows it (Determined SDK's ``Checkpoint`` fields): the
    fields of :class:`~ckptstore.checkpointing.index.CheckpointRecord` (the one place they are
    spelled out) plus when the row last changed.

    ``resources`` is ``{relpath: size}``; ``state`` is one of PENDING, COMMITTED,
    PARTIALLY_DELETED, DELETING, DELETED.
    """

    updated_at: _dt.datetime | None = None

    def to_record(self) -> CheckpointRecord:
        """This checkpoint as the :class:`CheckpointRecord` the checkpointing layer uses."""
        return CheckpointRecord(**record_fields(self))


def record_fields(record: CheckpointRecord) -> dict[str, Any]:
    """The :class:`CheckpointRecord` fields of ``record`` (dicts copied)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(CheckpointRecord):
        value = getattr(record, field.name)
        out[field.name] = dict(value) if isinstance(value, dict) else value
    return out


#: The one metric lookup (:func:`ckptstore.checkpointing.metrics.metric_value`), under the name
#: the registry has always exported.
lookup_metric = metric_value
