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

import sqlalchemy as sa

metadata = sa.MetaData()

schema_version = sa.Table(
    "ckptstore_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("applied_at", sa.DateTime, nullable=False),
)

experiments = sa.Table(
    "experiments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=True),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

trials = sa.Table(
    "trials",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "experiment_id",
        sa.Integer,
        sa.ForeignKey("experiments.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column("hparams", sa.JSON, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    # Migration 5: the searcher's slot this trial fills (unique per experiment, see
    # Registry.ensure_slot_trial), so a slot retried after its runner died finds its trial.
    sa.Column("search_slot", sa.Integer, nullable=True),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("uuid", sa.String(64), primary_key=True),
    sa.Column(
        "trial_id",
        sa.Integer,
        sa.ForeignKey("trials.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column(
        "experiment_id",
        sa.Integer,
        sa.ForeignKey("experiments.id", ondelete="SET NULL"),
        nullable=True,
        index=True,
    ),
    sa.Column("steps_completed", sa.BigInteger, nullable=False),
    sa.Column("continue_id", sa.JSON, nullable=True),
    sa.Column("state", sa.String(32), nullable=False, index=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=False),
    sa.Column("resources", sa.JSON, nullable=False),
    sa.Column("storage_url", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "trial_id",
        sa.Integer,
        sa.ForeignKey("trials.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("group", sa.String(64), nullable=False),
    sa.Column("steps_completed", sa.BigInteger, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=False),
    sa.Column("reported_at", sa.DateTime, nullable=False),
    sa.Index("ix_metrics_trial_group_steps", "trial_id", "group", "steps_completed"),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=False, unique=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("labels", sa.JSON, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("archived", sa.Boolean, nullable=False),
    sa.Column("last_version", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
)

model_versions = sa.Table(
    "model_versions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column(
        "checkpoint_uuid",
        sa.String(64),
        sa.ForeignKey("checkpoints.uuid", ondelete="RESTRICT"),
        nullable=False,
        index=True,
    ),
    sa.Column("notes", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_version"),
)

model_aliases = sa.Table(
    "model_aliases",
    metadata,
    sa.Column(
        "model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("alias", sa.String(128), primary_key=True),
    sa.Column(
        "version_id",
        sa.Integer,
        sa.ForeignKey("model_versions.id", ondelete="CASCADE"),
        nullable=False,
    ),
)

#: Non-training jobs (``ckptstore job run``: batch inference, evaluation, export), migration 6:
#: the config as given, where it ran, its state, the exit status and the output of its workers.
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(256), nullable=True),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("model_dir", sa.Text, nullable=False),
    sa.Column("storage_url", sa.Text, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("log", sa.Text, nullable=False),
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
    sa.Column("checkpoint_uuid", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(256), primary_key=True),
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
