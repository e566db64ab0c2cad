"""Rows of the registry's tables turned into entities, and the checks on values written to them.

One owner for a checkpoint's columns: :func:`checkpoint_values` (entity -> row) and
:func:`checkpoint_from_row` (row -> entity); :class:`~ckptstore.registry.registry.Registry`,
:mod:`~ckptstore.registry.models` and :mod:`~ckptstore.registry.reindex` all use these.

Example::

    from ckptstore.registry.rows import checkpoint_from_row

    checkpoint = checkpoint_from_row(conn.execute(select_stmt).one())
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.checkpointing.index import STATES, CheckpointRecord
from ckptstore.jsonsafe import to_json
from ckptstore.registry import schema
from ckptstore.registry.entities import RUN_STATES, Checkpoint, Experiment, Trial, record_fields
from ckptstore.validators import int_at_least


def _as_dict(value: Any) -> dict[str, Any]:
    # A JSON column written before the registry checked values (or by another tool) may hold
    # a list or a string: read as empty, so one odd row does not break a listing of all.
    return dict(value) if isinstance(value, dict) else {}


def _resources(value: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in (value or {}).items()}


#: How a checkpoint field is turned into its column (entity -> row) and back (row -> entity);
#: fields not listed are stored as they are. The fields themselves are those of
#: :class:`~ckptstore.checkpointing.index.CheckpointRecord` plus ``updated_at``.
_TO_ROW: dict[str, Any] = {
    "steps_completed": int,
    "metadata": lambda v: to_json(dict(v or {}), what="checkpoint metadata"),
    "metrics": lambda v: to_json(dict(v or {}), what="checkpoint metrics"),
    "resources": _resources,
    "storage_url": lambda v: v or "",
}
_FROM_ROW: dict[str, Any] = {
    "steps_completed": int,
    "metadata": _as_dict,
    "metrics": _as_dict,
    "resources": _resources,
    "created_at": schema.from_db_time,
    "updated_at": schema.from_db_time,
}


def checkpoint_from_row(row: Any) -> Checkpoint:
    """A :class:`Checkpoint` from a ``checkpoints`` row."""
    m = row._mapping
    names = [f.name for f in dataclasses.fields(Checkpoint)]
    return Checkpoint(**{n: _FROM_ROW.get(n, lambda v: v)(m[n]) for n in names})


def checkpoint_values(record: CheckpointRecord) -> dict[str, Any]:
    """The ``checkpoints`` row of ``record`` (validated; ``updated_at`` is now)."""
    if not isinstance(record, CheckpointRecord):
        raise errors.InvalidConfig(
            f"record_checkpoint needs a CheckpointRecord. Received: {type(record).__name__}"
        )
    if not record.uuid or not isinstance(record.uuid, str):
        raise errors.InvalidConfig(
            f"A checkpoint record needs a non-empty string uuid. Received: uuid={record.uuid!r}"
        )
    check_checkpoint_state(record.state)
    check_steps(record.steps_completed)
    for name in ("trial_id", "experiment_id"):
        if getattr(record, name) is not None:
            check_id(getattr(record, name), name)
    now = schema.utcnow()
    values = {n: _TO_ROW.get(n, lambda v: v)(v) for n, v in record_fields(record).items()}
    values["created_at"] = schema.to_db_time(record.created_at) if record.created_at else now
    values["updated_at"] = now
    return values


def experiment_from_row(row: Any) -> Experiment:
    return Experiment(
        id=row.id,
        name=row.name,
        config=_as_dict(row.config),
        description=row.description,
        state=row.state,
        created_at=schema.from_db_time(row.created_at),
        updated_at=schema.from_db_time(row.updated_at),
    )


def trial_from_row(row: Any) -> Trial:
    return Trial(
        id=row.id,
        experiment_id=row.experiment_id,
        hparams=_as_dict(row.hparams),
        state=row.state,
        created_at=schema.from_db_time(row.created_at),
        updated_at=schema.from_db_time(row.updated_at),
        heartbeat_at=schema.from_db_time(getattr(row, "heartbeat_at", None)),
    )


def check_run_state(state: str, what: str) -> None:
    if state not in RUN_STATES:
        raise errors.InvalidConfig(
            f"Unknown {what} state. Received: state={state!r}; use one of {', '.join(RUN_STATES)}."
        )


def check_checkpoint_state(state: str) -> None:
    if state not in STATES:
        raise errors.InvalidConfig(
            f"Unknown checkpoint state. Received: state={state!r}; use one of {', '.join(STATES)}."
        )


def check_id(value: Any, name: str) -> None:
    int_at_least(name, value, 1, maximum=schema.INT_MAX)


def check_steps(value: Any) -> None:
    int_at_least("steps_completed", value, 0, maximum=schema.BIGINT_MAX)


def trial_not_found(trial_id: Any) -> errors.TrialNotFound:
    return errors.TrialNotFound(
        f"No trial with id {trial_id!r} in the registry. Check the id (list_trials() shows "
        "them), or create it with createtrial_from_row()/ensuretrial_from_row()."
    )


def experiment_not_found(experiment_id: Any) -> errors.ExperimentNotFound:
    return errors.ExperimentNotFound(
        f"No experiment with id {experiment_id!r} in the registry. Check the id "
        "(list_experiments() shows them) or create it with createexperiment_from_row()."
    )


#: The fewest characters of a UUID accepted in its place (when they name one checkpoint).
MIN_UUID_PREFIX = 8


def checkpoint_row(conn: sa.Connection, table: sa.Table, uuid: str) -> Any:
    """The row whose ``uuid`` is ``uuid``, else the one row it is a unique prefix of (at least
    :data:`MIN_UUID_PREFIX` characters, as ``git`` takes a short hash); None when none."""
    row = conn.execute(sa.select(table).where(table.c.uuid == uuid)).first()
    if row is not None or len(uuid) < MIN_UUID_PREFIX or not _PREFIX.fullmatch(uuid):
        return row
    rows = conn.execute(
        sa.select(table).where(table.c.uuid.startswith(uuid.lower(), autoescape=True)).limit(3)
    ).all()
    if len(rows) > 1:
        raise errors.InvalidConfig(
            f"The UUID prefix {uuid!r} names several checkpoints ({', '.join(r.uuid for r in rows)}"
            f"{', ...' if len(rows) > 2 else ''}). Give more of the UUID."
        )
    return rows[0] if rows else None


_PREFIX = re.compile(r"[0-9a-fA-F-]+")


def delete_trial_rows(conn: sa.Connection, trial_id: int) -> None:
    """Delete trial ``trial_id``, its metrics and its DELETED checkpoint rows; TrialNotFound
    if there is none, CheckpointConflict while it has checkpoints in another state."""
    trials, checkpoints, metrics = schema.trials, schema.checkpoints, schema.metrics
    if conn.execute(sa.select(trials.c.id).where(trials.c.id == trial_id)).first() is None:
        raise trial_not_found(trial_id)
    mine = checkpoints.c.trial_id == trial_id
    left = conn.execute(sa.select(checkpoints.c.uuid).where(mine, checkpoints.c.state != "DELETED"))
    left = left.all()
    if left:
        raise errors.CheckpointConflict(
            f"Trial {trial_id} still has {len(left)} checkpoint(s) (e.g. {left[0][0]}); "
            f"delete them first (`ckptstore trial delete {trial_id} --yes` does)."
        )
    conn.execute(checkpoints.delete().where(mine))
    conn.execute(metrics.delete().where(metrics.c.trial_id == trial_id))
    conn.execute(trials.delete().where(trials.c.id == trial_id))


def checkpoint_not_found(uuid: Any) -> errors.CheckpointNotFound:
    return errors.CheckpointNotFound(
        f"No checkpoint with uuid {uuid!r} in the registry. Check the UUID (list_checkpoints() "
        "shows them); if the checkpoint exists in storage, run reindex(storage) first."
    )
