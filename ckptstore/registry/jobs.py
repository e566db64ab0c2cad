"""Jobs in the registry: non-training runs started by ``ckptstore job run`` (batch inference,
evaluation, export), with their state, exit status and output; and the evaluations a job records
against the checkpoint it evaluated.

Job states: ``ACTIVE`` while it runs, then ``COMPLETED`` (every worker exited 0), ``ERROR`` or
``CANCELED`` (stopped by SIGTERM/SIGINT). ``log`` holds the workers' output, at most
:data:`MAX_LOG_CHARS` (the start is cut first).

Example::

    with Registry() as registry:
        job_id = registry.create_job({"entrypoint_script": "python3 predict.py"}, "/models", "/ckpts")
        registry.set_job_state(job_id, "COMPLETED", exit_code=0, log="done\\n")
        print(registry.get_job(job_id).state)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.registry import schema
from ckptstore.registry.db import Database

_J = schema.jobs
_C = schema.checkpoints

JOB_STATES = ("ACTIVE", "COMPLETED", "ERROR", "CANCELED")
#: The most output kept per job (the end is what explains a failure).
MAX_LOG_CHARS = 1_000_000
#: Key of a job's stored config listing the checkpoints it loaded (``job describe`` shows them).
CHECKPOINTS_USED_KEY = "ckptstore_checkpoints_loaded"

#: Key of a checkpoint's ``metrics`` holding the evaluations jobs recorded against it.
EVALUATIONS_KEY = "evaluations"


@dataclasses.dataclass(frozen=True)
class Job:
    """One job row. Times are aware UTC."""

    id: int
    name: str | None
    config: dict[str, Any]
    model_dir: str
    storage_url: str
    state: str
    exit_code: int | None
    log: str
    created_at: _dt.datetime | None
    updated_at: _dt.datetime | None
    ended_at: _dt.datetime | None


def _job(row: Any) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        config=dict(row.config or {}),
        model_dir=row.model_dir,
        storage_url=row.storage_url,
        state=row.state,
        exit_code=row.exit_code,
        log=row.log or "",
        created_at=schema.from_db_time(row.created_at),
        updated_at=schema.from_db_time(row.updated_at),
        ended_at=schema.from_db_time(row.ended_at),
    )


def job_not_found(job_id: Any) -> errors.JobNotFound:
    return errors.JobNotFound(
        f"No job with id {job_id!r} in the registry. `ckptstore job list` shows the jobs."
    )


def _check_state(state: str) -> None:
    if state not in JOB_STATES:
        raise errors.InvalidConfig(f"A job state is one of {JOB_STATES}. Received: {state!r}.")


class JobStore:
    """Reads and writes the ``jobs`` table (used by :class:`~ckptstore.registry.Registry`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def create(
        self, config: Mapping[str, Any], model_dir: str, storage_url: str, name: str | None = None
    ) -> int:
        now = schema.utcnow()

        def fn(conn: sa.Connection) -> int:
            result = conn.execute(
                _J.insert().values(
                    name=name,
                    config=dict(config),
                    model_dir=model_dir,
                    storage_url=storage_url,
                    state="ACTIVE",
                    exit_code=None,
                    log="",
                    created_at=now,
                    updated_at=now,
                    ended_at=None,
                )
            )
            return int(result.inserted_primary_key[0])

        return self._db.write(fn, what="create a job")

    def update(
        self,
        job_id: int,
        *,
        state: str | None = None,
        exit_code: int | None = None,
        log: str | None = None,
    ) -> None:
        values: dict[str, Any] = {"updated_at": schema.utcnow()}
        if state is not None:
            _check_state(state)
            values["state"] = state
            if state != "ACTIVE":
                values["ended_at"] = values["updated_at"]
        if exit_code is not None:
            values["exit_code"] = int(exit_code)
        if log is not None:
            # Workers' output may hold NUL bytes or lone surrogates, which the log column
            # refuses (schema.Str): kept readable as U+FFFD / "?" instead of losing the log.
            tail = log[-MAX_LOG_CHARS:].replace("\x00", "\ufffd")
            values["log"] = tail.encode("utf-8", "replace").decode("utf-8")

        def fn(conn: sa.Connection) -> None:
            if conn.execute(_J.update().where(_J.c.id == job_id).values(**values)).rowcount == 0:
                raise job_not_found(job_id)

        self._db.write(fn, what="update a job")

    def get(self, job_id: int) -> Job:
        def fn(conn: sa.Connection) -> Job:
            row = conn.execute(sa.select(_J).where(_J.c.id == job_id)).first()
            if row is None:
                raise job_not_found(job_id)
            return _job(row)

        return self._db.read(fn, what="get a job")

    def list(self) -> list[Job]:
        def fn(conn: sa.Connection) -> list[Job]:
            return [_job(r) for r in conn.execute(sa.select(_J).order_by(_J.c.id))]

        return self._db.read(fn, what="list jobs")

    def add_checkpoint(self, job_id: int, uuid: str) -> None:
        """Add ``uuid`` to the checkpoints the job loaded (kept in its config, under
        :data:`CHECKPOINTS_USED_KEY`, so no column is needed)."""

        def fn(conn: sa.Connection) -> None:
            row = conn.execute(sa.select(_J.c.config).where(_J.c.id == job_id)).first()
            if row is None:
                raise job_not_found(job_id)
            config = dict(row[0] or {})
            used = list(config.get(CHECKPOINTS_USED_KEY) or [])
            if uuid not in used:
                config[CHECKPOINTS_USED_KEY] = [*used, uuid]
                conn.execute(_J.update().where(_J.c.id == job_id).values(config=config))

        self._db.write(fn, what="record a job's checkpoint")

    def add_evaluation(self, uuid: str, evaluation: Mapping[str, Any]) -> None:
        """Append ``evaluation`` to the checkpoint's ``metrics["evaluations"]`` list."""
        from ckptstore.registry.rows import checkpoint_not_found

        def fn(conn: sa.Connection) -> None:
            row = conn.execute(sa.select(_C.c.metrics).where(_C.c.uuid == uuid)).first()
            if row is None:
                raise checkpoint_not_found(uuid)
            metrics = dict(row.metrics or {})
            metrics[EVALUATIONS_KEY] = [*metrics.get(EVALUATIONS_KEY, []), dict(evaluation)]
            conn.execute(
                _C.update()
                .where(_C.c.uuid == uuid)
                .values(metrics=metrics, updated_at=schema.utcnow())
            )

        self._db.write(fn, what="record a checkpoint evaluation")


__all__ = ["EVALUATIONS_KEY", "JOB_STATES", "Job", "JobStore", "job_not_found"]
