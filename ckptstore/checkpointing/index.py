"""What the checkpointing layer needs from an index of checkpoints (the registry).

``checkpointing`` sits below ``registry`` and never imports it. Instead it talks to any object
that satisfies :class:`CheckpointIndex`; :class:`ckptstore.registry.Registry` does. With no
index, checkpointing still works from storage alone (``latest`` scans manifests).

An index may also implement :class:`PinningIndex` (the registry does): pins make
``CheckpointContext.protect()`` and checkpoints being restored visible to GC in *other*
processes. Without it, protection is known only inside the process that asked for it.

Example::

    from ckptstore.checkpointing.index import CheckpointRecord

    record = CheckpointRecord(uuid="...", trial_id=3, steps_completed=100, state="COMMITTED")
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, Protocol, runtime_checkable

#: Checkpoint states, as Determined names them.
PENDING = "PENDING"
COMMITTED = "COMMITTED"
PARTIALLY_DELETED = "PARTIALLY_DELETED"
#: A delete has started: set *before* any file is removed, so an index that cannot be written
#: stops the delete before it begins, and a delete cut short is never mistaken for a live
#: checkpoint. Reconcile (and so GC) finishes it.
DELETING = "DELETING"
DELETED = "DELETED"
STATES = (PENDING, COMMITTED, PARTIALLY_DELETED, DELETING, DELETED)
#: States of a checkpoint that can be read (the ones listings, latest and best look at).
LIVE_STATES = (COMMITTED, PARTIALLY_DELETED)


@dataclasses.dataclass
class CheckpointRecord:
    """One checkpoint as the index stores it. ``resources`` is ``{relpath: size}``."""

    uuid: str
    trial_id: int | None = None
    experiment_id: int | None = None
    steps_completed: int = 0
    continue_id: Any = None
    state: str = PENDING
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    resources: dict[str, int] = dataclasses.field(default_factory=dict)
    storage_url: str = ""
    created_at: _dt.datetime | None = None


@runtime_checkable
class CheckpointIndex(Protocol):
    """The calls checkpointing makes on the registry."""

    def record_checkpoint(self, record: CheckpointRecord) -> None:
        """Insert or update (by uuid) a checkpoint row; creates the trial/experiment rows
        it refers to if missing."""

    def set_checkpoint_state(
        self, uuid: str, state: str, resources: dict[str, int] | None = None
    ) -> None:
        """Change a checkpoint's state (and its resource list, after a partial delete)."""

    def checkpoint_records(
        self,
        *,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        states: tuple[str, ...] = (COMMITTED, PARTIALLY_DELETED),
    ) -> list[CheckpointRecord]:
        """Checkpoints filtered by trial/experiment and state, oldest first by
        (steps_completed, created_at)."""

    def protected_checkpoint_uuids(self) -> set[str]:
        """UUIDs GC must never delete: registered as a model version (or otherwise pinned)."""


@runtime_checkable
class PinningIndex(CheckpointIndex, Protocol):
    """A :class:`CheckpointIndex` that can also hold pins: leases that keep GC, in any process
    using the same index, from deleting a checkpoint.

    A pin is identified by ``(uuid, holder)``; ``holder`` names the owner (ckptstore uses
    ``host:pid:random``). A pin whose ``expires_at`` has passed no longer protects anything,
    so a crashed process cannot pin a checkpoint forever; ``expires_at=None`` pins until
    :meth:`unpin_checkpoint`. :meth:`CheckpointIndex.protected_checkpoint_uuids` includes
    the UUIDs of unexpired pins.

    Example::

        import datetime as dt

        index.pin_checkpoint(uuid, "host:123:ab12", dt.datetime.now(dt.timezone.utc)
                             + dt.timedelta(minutes=10))
        assert uuid in index.protected_checkpoint_uuids()
        index.unpin_checkpoint(uuid, "host:123:ab12")
    """

    def pin_checkpoint(self, uuid: str, holder: str, expires_at: _dt.datetime | None) -> None:
        """Create or renew (by ``(uuid, holder)``) a pin lasting until ``expires_at``
        (aware or naive UTC; None: until unpinned). The checkpoint need not be in the index."""

    def unpin_checkpoint(self, uuid: str, holder: str) -> None:
        """Remove ``holder``'s pin on ``uuid``; a pin that is not there is fine."""


def supports_pins(index: object) -> bool:
    """True if ``index`` can hold cross-process pins (see :class:`PinningIndex`)."""
    return callable(getattr(index, "pin_checkpoint", None)) and callable(
        getattr(index, "unpin_checkpoint", None)
    )


def searcher_metric_of(
    index: object, *, trial_id: int | None, experiment_id: int | None
) -> tuple[str, bool] | None:
    """``(metric, smaller_is_better)`` of the searcher recorded for the trial's experiment, when
    the index records one (the registry does: ``searcher.metric`` of the experiment config);
    else None."""
    lookup = getattr(index, "searcher_metric", None)
    if lookup is None:
        return None
    return lookup(trial_id=trial_id, experiment_id=experiment_id)
