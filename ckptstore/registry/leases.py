"""Trial leases: which experiment runner works on a trial (the registry side of several runners,
on one or many machines, sharing one search).

A runner *claims* a trial before it starts the trial's process: an atomic
``INSERT ... ON CONFLICT DO UPDATE ... WHERE (lease expired or released) ...`` that succeeds
for exactly one claimant. It renews the lease while the trial runs (a heartbeat) and releases it
when the trial process ends. A runner that dies stops renewing, so its trials become claimable
once the lease expires. :meth:`TrialLeaseStore.create_claimed_trial` counts an experiment's
trials and creates (and claims) a new one in one transaction, with the experiment row locked,
so racing runners never create more than ``max_trials``; its ``hparams`` may be a function,
called under that lock only when there is room (a searcher then proposes values only for
trials that will exist, in the order they are created).

Lease times come from the database's clock (PostgreSQL ``statement_timestamp()``), so clock
skew between machines does not matter; on SQLite (one machine) the local clock is used.

Example::

    from ckptstore.registry import Registry

    with Registry("postgresql://me@db/ckpts") as registry:
        if registry.claim_trial(7, owner="host-a:1234", lease_seconds=60):
            registry.renew_trial_lease(7, "host-a:1234", 60)   # every few seconds
            registry.release_trial(7, "host-a:1234")
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.registry import schema
from ckptstore.registry.db import Database

_L = schema.trial_leases
_T = schema.trials
_E = schema.experiments

#: Trial states a lease can no longer be claimed in.
FINISHED_TRIAL_STATES = ("COMPLETED", "ERROR", "CANCELED")


@dataclasses.dataclass(frozen=True)
class TrialLease:
    """The lease on a trial: ``owner`` works on it until ``expires_at`` unless it renews.

    ``expired`` is judged by the database clock when the lease was read; ``released_at`` is set
    once the owner let the trial go (the row stays as a record of the last owner); ``claims``
    counts how many times a runner took the trial. Times are aware UTC.
    """

    trial_id: int
    owner: str
    expires_at: _dt.datetime
    acquired_at: _dt.datetime
    renewed_at: _dt.datetime
    released_at: _dt.datetime | None
    claims: int
    expired: bool

    @property
    def held(self) -> bool:
        """True while the owner holds the lease (not released and not expired)."""
        return self.released_at is None and not self.expired


class TrialLeaseStore:
    """Reads and writes the ``trial_leases`` table (used by :class:`Registry`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # ---- clock --------------------------------------------------------------------------------
    def _now(self, conn: sa.Connection) -> _dt.datetime:
        """Now as naive UTC, from the database server when it is PostgreSQL."""
        if self._db.dialect == "postgresql":
            value = conn.execute(
                sa.select(sa.func.timezone("UTC", sa.func.statement_timestamp()))
            ).scalar_one()
            return value.replace(tzinfo=None)
        return schema.utcnow()

    # ---- claims -------------------------------------------------------------------------------
    def claim(
        self, trial_id: int, owner: str, lease_seconds: float, replace_owner: str | None
    ) -> bool:
        _check_owner(owner)
        _check_lease(lease_seconds)
        if replace_owner is not None:
            _check_owner(replace_owner, "replace_owner")

        def fn(conn: sa.Connection) -> bool:
            state = conn.execute(sa.select(_T.c.state).where(_T.c.id == trial_id)).scalar()
            if state is None:
                raise _trial_not_found(trial_id)
            if state in FINISHED_TRIAL_STATES:
                return False
            now = self._now(conn)
            return self._claim_row(conn, trial_id, owner, now, lease_seconds, replace_owner)

        return self._db.write(fn, what="claim a trial")

    def _claim_row(
        self,
        conn: sa.Connection,
        trial_id: int,
        owner: str,
        now: _dt.datetime,
        lease_seconds: float,
        replace_owner: str | None = None,
    ) -> bool:
        expires = now + _dt.timedelta(seconds=lease_seconds)
        stmt = self._db.insert(_L).values(
            trial_id=trial_id,
            owner=owner,
            expires_at=expires,
            acquired_at=now,
            renewed_at=now,
            released_at=None,
            claims=1,
        )
        free = sa.or_(_L.c.expires_at <= now, _L.c.released_at.is_not(None))
        takeable = [free, _L.c.owner == owner]
        if replace_owner is not None:
            takeable.append(_L.c.owner == replace_owner)
        # Renewing one's own held lease keeps acquired_at and the claim count.
        renewing = sa.and_(_L.c.owner == owner, sa.not_(free))
        stmt = stmt.on_conflict_do_update(
            index_elements=[_L.c.trial_id],
            set_={
                "owner": owner,
                "expires_at": expires,
                "renewed_at": now,
                "released_at": None,
                "acquired_at": sa.case((renewing, _L.c.acquired_at), else_=now),
                "claims": sa.case((renewing, _L.c.claims), else_=_L.c.claims + 1),
            },
            where=sa.or_(*takeable),
        )
        return conn.execute(stmt.returning(_L.c.trial_id)).first() is not None

    def renew(self, trial_id: int, owner: str, lease_seconds: float) -> bool:
        _check_owner(owner)
        _check_lease(lease_seconds)

        def fn(conn: sa.Connection) -> bool:
            now = self._now(conn)
            result = conn.execute(
                _L.update()
                .where(
                    _L.c.trial_id == trial_id,
                    _L.c.owner == owner,
                    _L.c.released_at.is_(None),
                    # An expired lease is still ours until someone else claims it.
                )
                .values(expires_at=now + _dt.timedelta(seconds=lease_seconds), renewed_at=now)
                .returning(_L.c.trial_id)
            )
            return result.first() is not None

        return self._db.write(fn, what="renew a trial lease")

    def release(self, trial_id: int, owner: str) -> bool:
        _check_owner(owner)

        def fn(conn: sa.Connection) -> bool:
            now = self._now(conn)
            result = conn.execute(
                _L.update()
                .where(_L.c.trial_id == trial_id, _L.c.owner == owner, _L.c.released_at.is_(None))
                .values(expires_at=now, released_at=now)
                .returning(_L.c.trial_id)
            )
            return result.first() is not None

        return self._db.write(fn, what="release a trial lease")

    def create_claimed_trial(
        self,
        experiment_id: int,
        hparams: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
        max_trials: int,
        owner: str,
        lease_seconds: float,
    ) -> int | None:
        _check_owner(owner)
        _check_lease(lease_seconds)
        if isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 0:
            raise errors.InvalidConfig(
                f"max_trials must be a non-negative integer. Received: max_trials={max_trials!r}"
            )

        def fn(conn: sa.Connection) -> int | None:
            # Lock the experiment row: racing creators queue here, and each counts the trials
            # the previous one committed (SQLite: BEGIN IMMEDIATE already serialises writers).
            locked = conn.execute(
                sa.select(_E.c.id).where(_E.c.id == experiment_id).with_for_update()
            ).first()
            if locked is None:
                raise errors.ExperimentNotFound(
                    f"No experiment with id {experiment_id!r} in the registry. Check the id "
                    "(list_experiments() shows them) or create it with create_experiment()."
                )
            count = conn.execute(
                sa.select(sa.func.count())
                .select_from(_T)
                .where(_T.c.experiment_id == experiment_id)
            ).scalar_one()
            if count >= max_trials:
                return None
            values = hparams() if callable(hparams) else hparams
            if values is not None and not isinstance(values, Mapping):
                raise errors.InvalidConfig(
                    f"hparams must be a dict. Received: {type(values).__name__}"
                )
            now = self._now(conn)
            stored = schema.utcnow()
            trial_id = int(
                conn.execute(
                    _T.insert().values(
                        experiment_id=experiment_id,
                        hparams=dict(values or {}),
                        state="ACTIVE",
                        created_at=stored,
                        updated_at=stored,
                    )
                ).inserted_primary_key[0]
            )
            if not self._claim_row(conn, trial_id, owner, now, lease_seconds):
                raise errors.RegistryError(f"New trial {trial_id} already had a lease.")
            return trial_id

        return self._db.write(fn, what="create a claimed trial")

    # ---- reads --------------------------------------------------------------------------------
    def get(self, trial_id: int) -> TrialLease | None:
        def fn(conn: sa.Connection) -> TrialLease | None:
            row = conn.execute(sa.select(_L).where(_L.c.trial_id == trial_id)).first()
            return None if row is None else _lease(row, self._now(conn))

        return self._db.read(fn, what="get a trial lease")

    def list(self, experiment_id: int | None) -> list[TrialLease]:
        def fn(conn: sa.Connection) -> list[TrialLease]:
            query = sa.select(_L).order_by(_L.c.trial_id)
            if experiment_id is not None:
                query = query.join(_T, _T.c.id == _L.c.trial_id).where(
                    _T.c.experiment_id == experiment_id
                )
            rows = conn.execute(query).all()
            now = self._now(conn)
            return [_lease(row, now) for row in rows]

        return self._db.read(fn, what="list trial leases")


def _lease(row: Any, now: _dt.datetime) -> TrialLease:
    m = row._mapping
    return TrialLease(
        trial_id=int(m["trial_id"]),
        owner=m["owner"],
        expires_at=schema.from_db_time(m["expires_at"]),  # type: ignore[arg-type]
        acquired_at=schema.from_db_time(m["acquired_at"]),  # type: ignore[arg-type]
        renewed_at=schema.from_db_time(m["renewed_at"]),  # type: ignore[arg-type]
        released_at=schema.from_db_time(m["released_at"]),
        claims=int(m["claims"]),
        expired=m["expires_at"] <= now,
    )


def _check_owner(value: Any, name: str = "owner") -> None:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise errors.InvalidConfig(
            f"A trial lease's {name} must be a non-empty string of at most 256 characters "
            f"(e.g. 'host:pid'). Received: {name}={value!r}"
        )


def _check_lease(value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise errors.InvalidConfig(
            "lease_seconds must be a positive number of seconds (e.g. 60). "
            f"Received: lease_seconds={value!r}"
        )


def _trial_not_found(trial_id: Any) -> errors.TrialNotFound:
    return errors.TrialNotFound(
        f"No trial with id {trial_id!r} in the registry. Check the id (list_trials() shows "
        "them), or create it with create_trial()/ensure_trial()."
    )
