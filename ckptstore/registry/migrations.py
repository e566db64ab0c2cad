"""Versioned schema migrations, applied in order when a registry is opened.

The table ``ckptstore_schema_version`` holds one row per applied migration. Opening a registry
reads the newest version without locking; only if migrations are missing does it take a lock
(PostgreSQL ``pg_advisory_xact_lock``, SQLite ``BEGIN IMMEDIATE``), re-read the version and
apply the rest in one transaction, so several processes opening a new database at once apply
each migration exactly once.

To change the schema, append a :class:`Migration` to :data:`MIGRATIONS`; never edit one that
has shipped.

Example::

    from ckptstore.registry.engine import make_engine
    from ckptstore.registry.migrations import migrate

    version = migrate(make_engine("sqlite:///tmp/registry.db"))
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ckptstore import errors
from ckptstore.registry import schema
from ckptstore.registry.engine import WRITE_OPTION, safe_url
from ckptstore.registry.retry import run_with_retry

logger = logging.getLogger(__name__)

#: Key of the PostgreSQL advisory lock held while migrating ("ckptstor" as an int64).
ADVISORY_LOCK_KEY = 0x636B707473746F72


@dataclasses.dataclass(frozen=True)
class Migration:
    """One schema step: ``apply(connection)`` runs inside the migration transaction."""

    version: int
    description: str
    apply: Callable[[sa.Connection], None]


_V1_TABLES = (
    schema.experiments,
    schema.trials,
    schema.checkpoints,
    schema.metrics,
    schema.models,
    schema.model_versions,
    schema.model_aliases,
)


def _v1_initial_tables(conn: sa.Connection) -> None:
    for table in _V1_TABLES:
        table.create(conn, checkfirst=True)


def _v2_checkpoint_order_index(conn: sa.Connection) -> None:
    # Plain DDL: an sa.Index object would attach itself to the shared Table and leak into v1.
    conn.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_checkpoints_trial_steps_created "
        "ON checkpoints (trial_id, steps_completed, created_at)"
    )


def _v3_checkpoint_pins(conn: sa.Connection) -> None:
    schema.checkpoint_pins.create(conn, checkfirst=True)
    conn.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS ix_checkpoint_pins_expires_at ON checkpoint_pins (expires_at)"
    )


#: Migration 4's table (migration 5 drops it; it is no longer in the schema). Its foreign key
#: to trials.id is left out here: this copy lives in its own MetaData without ``trials``.
_V4_TRIAL_LEASES = sa.Table(
    "trial_leases",
    sa.MetaData(),
    sa.Column("trial_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("expires_at", sa.DateTime, nullable=False),
    sa.Column("acquired_at", sa.DateTime, nullable=False),
    sa.Column("renewed_at", sa.DateTime, nullable=False),
    sa.Column("released_at", sa.DateTime, nullable=True),
    sa.Column("claims", sa.Integer, nullable=False),
)


def _v4_trial_leases(conn: sa.Connection) -> None:
    _V4_TRIAL_LEASES.create(conn, checkfirst=True)


def _v5_search_slots(conn: sa.Connection) -> None:
    # Who runs which trial is now the Optuna study's business (heartbeats, re-queueing); the
    # registry only keeps which searcher slot each trial fills, so a re-queued slot finds its
    # trial again instead of creating a duplicate.
    conn.exec_driver_sql("DROP TABLE IF EXISTS trial_leases")
    columns = {c["name"] for c in sa.inspect(conn).get_columns("trials")}
    if "search_slot" not in columns:  # a database created at v1 by this code already has it
        conn.exec_driver_sql("ALTER TABLE trials ADD COLUMN search_slot INTEGER")
    conn.exec_driver_sql(
        "CREATE UNIQUE INDEX IF NOT EXISTS ux_trials_experiment_search_slot "
        "ON trials (experiment_id, search_slot)"
    )


def _v6_jobs(conn: sa.Connection) -> None:
    schema.jobs.create(conn, checkfirst=True)


def _v7_heartbeats_and_alias_history(conn: sa.Connection) -> None:
    columns = {c["name"] for c in sa.inspect(conn).get_columns("trials")}
    if "heartbeat_at" not in columns:  # a database created at v1 by this code already has it
        conn.exec_driver_sql("ALTER TABLE trials ADD COLUMN heartbeat_at TIMESTAMP")
    schema.model_alias_events.create(conn, checkfirst=True)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "experiments, trials, checkpoints, metrics, models", _v1_initial_tables),
    Migration(2, "index checkpoints by (trial, steps, created_at)", _v2_checkpoint_order_index),
    Migration(3, "checkpoint pins: cross-process GC protection leases", _v3_checkpoint_pins),
    Migration(4, "trial leases: one experiment runner per trial", _v4_trial_leases),
    Migration(
        5, "trial leases out (Optuna heartbeats own trials); trials.search_slot", _v5_search_slots
    ),
    Migration(6, "jobs: non-training runs (batch inference), state, exit code, log", _v6_jobs),
    Migration(
        7,
        "trials.heartbeat_at (a lost process shows); model alias history",
        _v7_heartbeats_and_alias_history,
    ),
)
LATEST_VERSION = MIGRATIONS[-1].version


def current_version(conn: sa.Connection) -> int:
    """The newest applied migration, 0 for an empty database."""
    if not sa.inspect(conn).has_table(schema.schema_version.name):
        return 0
    value = conn.execute(sa.select(sa.func.max(schema.schema_version.c.version))).scalar()
    return int(value or 0)


def migrate(engine: Engine) -> int:
    """Bring the database to :data:`LATEST_VERSION`; returns the version it is at."""

    def read() -> int:
        with engine.connect() as conn:
            return current_version(conn)

    version = run_with_retry(read, what="schema version check")
    if version == LATEST_VERSION:
        return version
    if version > LATEST_VERSION:
        raise errors.RegistryError(
            f"Registry {safe_url(engine.url)} has schema version {version}, newer than this "
            f"ckptstore understands ({LATEST_VERSION}). Upgrade ckptstore "
            "(`pip install -U ckptstore`)."
        )
    return run_with_retry(lambda: _migrate_locked(engine), what="schema migration")


def _migrate_locked(engine: Engine) -> int:
    with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
        with conn.begin():
            if engine.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(ADVISORY_LOCK_KEY)))
            schema.schema_version.create(conn, checkfirst=True)
            version = current_version(conn)
            for migration in MIGRATIONS:
                if migration.version <= version:
                    continue
                logger.info(
                    "Registry %s: applying schema migration %d (%s)",
                    safe_url(engine.url),
                    migration.version,
                    migration.description,
                )
                migration.apply(conn)
                conn.execute(
                    schema.schema_version.insert().values(
                        version=migration.version,
                        description=migration.description,
                        applied_at=schema.utcnow(),
                    )
                )
                version = migration.version
            return version
