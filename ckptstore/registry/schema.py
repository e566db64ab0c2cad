"""The registry's tables (SQLAlchemy Core), at the newest schema version.

Timestamps are stored as naive UTC (``DateTime`` without a zone, identical on SQLite and
PostgreSQL) and handed out as timezone-aware UTC datetimes. JSON columns hold dicts.
Migrations (:mod:`ckptstore.registry.migrations`) create and evolve these tables; never call
``metadata.create_all`` directly.

Example::

    from ckptstore.registry import schema
    print([t.name for t in schema.metadata.sorted_tables])
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.jsonsafe import to_json
from ckptstore.validators import check_text, is_int

metadata = sa.MetaData()

#: The range of an ``Integer`` (ids, counts) and a ``BigInteger`` (steps) column on PostgreSQL;
#: SQLite stores 64-bit integers. Values outside are refused before the database on both, so
#: the two behave the same (an ``InvalidConfig`` naming the value, not a driver error).
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1


# ---- column types: every value bound to a statement is checked here, the same on SQLite and
# PostgreSQL (inserts, updates and WHERE clauses alike), before the database sees it ----------
class Int(sa.types.TypeDecorator[int]):
    """``Integer`` refusing values outside PostgreSQL's 32-bit range."""

    impl = sa.Integer
    cache_ok = True
    _max = INT_MAX

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        if is_int(value) and not -self._max - 1 <= value <= self._max:
            raise errors.InvalidConfig(
                f"{value} is out of range for the registry (this column holds "
                f"{-self._max - 1} to {self._max}; ids are at most {INT_MAX}); pass a "
                f"number in range. Received: {value!r}"
            )
        return value


class BigInt(Int):
    """``BigInteger`` refusing values outside the 64-bit range (SQLite and PostgreSQL)."""

    impl = sa.BigInteger
    cache_ok = True
    _max = BIGINT_MAX


class Str(sa.types.TypeDecorator[str]):
    """``String(n)`` refusing more than ``n`` characters, NUL characters (PostgreSQL cannot
    store them; SQLite can, so they would work on one database only) and lone surrogates."""

    impl = sa.String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        if not isinstance(value, str):
            return value
        length = getattr(self.impl, "length", None)
        # PostgreSQL enforces String(n); SQLite does not: refused on both, before either.
        if length is not None and len(value) > length:
            raise errors.InvalidConfig(
                f"text of {len(value)} characters is longer than the registry stores here (at "
                f"most {length}); shorten it. Received: {value[:80]!r}..."
            )
        return check_text("text", value)


class TextStr(Str):
    """``Text`` with the checks of :class:`Str`."""

    impl = sa.Text
    cache_ok = True


class Json(sa.types.TypeDecorator[Any]):
    """``JSON`` holding what :func:`ckptstore.jsonsafe.to_json` makes of a value: NaN/inf as
    null (PostgreSQL refuses them, SQLite stored them), lone surrogates refused."""

    impl = sa.JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return to_json(value, what="a registry JSON value")


schema_version = sa.Table(
    "ckptstore_schema_version",
    metadata,
    sa.Column("version", Int, primary_key=True, autoincrement=False),
    sa.Column("description", Str(200), nullable=False),
    sa.Column("applied_at", sa.DateTime, nullable=False),
)

experiments = sa.Table(
    "experiments",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column("name", Str(256), nullable=True),
    sa.Column("config", Json, nullable=False),
    sa.Column("description", TextStr, nullable=True),
    sa.Column("state", Str(32), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

trials = sa.Table(
    "trials",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column(
        "experiment_id",
        Int,
        sa.ForeignKey("experiments.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column("hparams", Json, nullable=False),
    sa.Column("state", Str(32), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    # Migration 5: the searcher's slot this trial fills (unique per experiment, see
    # Registry.ensure_slot_trial), so a slot retried after its runner died finds its trial.
    sa.Column("search_slot", Int, nullable=True),
    # Migration 7: when the process running the trial last said it is alive (core.init's
    # heartbeat thread); an ACTIVE trial whose heartbeat is old has lost its process.
    sa.Column("heartbeat_at", sa.DateTime, nullable=True),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("uuid", Str(64), primary_key=True),
    sa.Column(
        "trial_id",
        Int,
        sa.ForeignKey("trials.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column(
        "experiment_id",
        Int,
        sa.ForeignKey("experiments.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column("steps_completed", BigInt, nullable=False),
    sa.Column("continue_id", Json, nullable=True),
    sa.Column("state", Str(32), nullable=False, index=True),
    sa.Column("metadata", Json, nullable=False),
    sa.Column("metrics", Json, nullable=False),
    sa.Column("resources", Json, nullable=False),
    sa.Column("storage_url", TextStr, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column(
        "trial_id",
        Int,
        sa.ForeignKey("trials.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("group", Str(64), nullable=False),
    sa.Column("steps_completed", BigInt, nullable=False),
    sa.Column("metrics", Json, nullable=False),
    sa.Column("reported_at", sa.DateTime, nullable=False),
    sa.Index("ix_metrics_trial_group_steps", "trial_id", "group", "steps_completed"),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column("name", Str(256), nullable=False, unique=True),
    sa.Column("description", TextStr, nullable=False),
    sa.Column("labels", Json, nullable=False),
    sa.Column("metadata", Json, nullable=False),
    sa.Column("archived", sa.Boolean, nullable=False),
    sa.Column("last_version", Int, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

model_versions = sa.Table(
    "model_versions",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column("model_id", Int, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
    sa.Column("version", Int, nullable=False),
    sa.Column(
        "checkpoint_uuid",
        Str(64),
        sa.ForeignKey("checkpoints.uuid", ondelete="RESTRICT"),
        nullable=False,
        index=True,
    ),
    sa.Column("notes", TextStr, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),
)

model_aliases = sa.Table(
    "model_aliases",
    metadata,
    sa.Column("model_id", Int, sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("alias", Str(128), primary_key=True),
    sa.Column(
        "version_id",
        Int,
        sa.ForeignKey("model_versions.id", ondelete="CASCADE"),
        nullable=False,
    ),
)

#: Every move of a model alias (migration 7): ``version`` None is a removal; ``previous``
#: the version the alias pointed at before (None: it was new). Who and when, for the model page.
model_alias_events = sa.Table(
    "model_alias_events",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column(
        "model_id",
        Int,
        sa.ForeignKey("models.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("alias", Str(128), nullable=False),
    sa.Column("version", Int, nullable=True),
    sa.Column("previous", Int, nullable=True),
    sa.Column("moved_by", Str(256), nullable=False),
    sa.Column("moved_at", sa.DateTime, nullable=False),
)

#: Non-training jobs (``ckptstore job run``: batch inference, evaluation, export), migration 6:
#: the config as given, where it ran, its state, the exit status and the output of its workers.
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", Int, primary_key=True, autoincrement=True),
    sa.Column("name", Str(256), nullable=True),
    sa.Column("config", Json, nullable=False),
    sa.Column("model_dir", TextStr, nullable=False),
    sa.Column("storage_url", TextStr, nullable=False),
    sa.Column("state", Str(32), nullable=False),
    sa.Column("exit_code", Int, nullable=True),
    sa.Column("log", TextStr, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.Column("ended_at", sa.DateTime, nullable=True),
)


#: Leases that keep GC from deleting a checkpoint (``CheckpointContext.protect()``,
#: ``restore_path``), one per (checkpoint, holder). No foreign key: a checkpoint may be pinned
#: before the index knows it (resumed from storage alone). ``expires_at`` NULL: until unpinned.
checkpoint_pins = sa.Table(
    "checkpoint_pins",
    metadata,
    sa.Column("checkpoint_uuid", Str(64), primary_key=True),
    sa.Column("holder", Str(256), primary_key=True),
    sa.Column("expires_at", sa.DateTime, nullable=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)


def utcnow() -> _dt.datetime:
    """Now, as the naive UTC datetime the tables store."""
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def to_db_time(value: _dt.datetime | None) -> _dt.datetime:
    """A datetime as naive UTC for storage (naive input is taken as UTC; None -> now)."""
    if value is None:
        return utcnow()
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value


def from_db_time(value: _dt.datetime | None) -> _dt.datetime | None:
    """A stored naive-UTC datetime as an aware UTC datetime."""
    if value is None:
        return None
    return value.replace(tzinfo=_dt.timezone.utc)
