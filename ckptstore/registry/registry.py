"""The registry: experiments, trials, metrics, checkpoints and models in one database.

Example::

    from ckptstore.registry import Registry

    with Registry("sqlite:///tmp/registry.db") as registry:  # or postgresql://user@host/db
        exp = registry.create_experiment("mnist", config={"searcher": {"metric": "val_loss"}})
        trial = registry.create_trial(experiment_id=exp, hparams={"lr": 0.01})
        registry.report_metrics(trial, "validation", 100, {"val_loss": 0.3})
        best = registry.best_checkpoint(experiment_id=exp)
        model = registry.create_model("mnist-cnn")
        if best is not None:
            model.register_version(best.uuid)
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from ckptstore import defaults, errors
from ckptstore.checkpointing.index import (
    LIVE_STATES,
    CheckpointRecord,
)
from ckptstore.jsonsafe import to_json
from ckptstore.registry import schema
from ckptstore.registry.checkpoint_queries import (  # noqa: F401 - DEFAULT_METRIC stays importable here
    DEFAULT_METRIC,
    CheckpointQueries,
)
from ckptstore.registry.db import Database
from ckptstore.registry.entities import (
    Experiment,
    MetricRow,
    Trial,
)
from ckptstore.registry.jobs import Job, JobStore
from ckptstore.registry.models import Model, ModelStore
from ckptstore.registry.pins import Pin, PinStore
from ckptstore.registry.rows import (
    check_checkpoint_state,
    check_id,
    check_run_state,
    check_steps,
    checkpoint_not_found,
    checkpoint_values,
    delete_trial_rows,
    experiment_from_row,
    experiment_not_found,
    trial_from_row,
    trial_not_found,
)
from ckptstore.validators import int_at_least

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

T = TypeVar("T")

_LIVE_STATES = LIVE_STATES

_E = schema.experiments
_T = schema.trials
_C = schema.checkpoints
_M = schema.metrics


class Registry(CheckpointQueries):
    """An index of experiments, trials, metrics, checkpoints and models.

    Args:
        url: ``sqlite:///path.db``, a plain file path (SQLite), or ``postgresql://`` /
            ``postgres://user:password@host:port/db`` (psycopg 3). None uses
            ``CKPTSTORE_REGISTRY`` or ``<ckptstore home>/registry.db`` (see
            :mod:`ckptstore.defaults`). The schema is created or migrated on open.

    The registry implements :class:`ckptstore.checkpointing.index.CheckpointIndex` and
    :class:`~ckptstore.checkpointing.index.PinningIndex`, so it can be passed to the
    checkpointing layer. It is safe to use from many processes and machines at
    once (short transactions, retried when they lose a race). ``repr`` and error messages never
    show the password.

    Example::

        with Registry() as registry:
            ckpt = registry.latest_checkpoint(trial_id=7)
    """

    def __init__(self, url: str | None = None) -> None:
        if url is None:
            url = defaults.default_registry_url()
        self._db = Database(url)
        self._models = ModelStore(self._db, self)
        self._pins = PinStore(self._db)
        self._jobs = JobStore(self._db)
        logger.debug("Opened registry %s (schema version %d)", self._db.url, self._db.version)

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The database URL with the password hidden."""
        return self._db.url

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    def close(self) -> None:
        """Release the database connections. The registry must not be used afterwards."""
        self._db.close()

    def add_barrier(self, wait: Callable[[], None]) -> Callable[[], None]:
        """Run ``wait()`` before each call on this registry, from any thread (not the calls
        nested in one), and before :meth:`close`; returns the function that removes it. Core's
        TrainContext passes its queued metric writes' wait: they come before what follows."""
        return self._db.add_barrier(wait)

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Registry({self.url!r})"

    def read(self, fn: Callable[[sa.Connection], T], *, what: str) -> T:
        """Run ``fn(connection)`` in one read transaction (retried when it loses a race), for
        views that page, sort and filter in SQL over :mod:`ckptstore.registry.schema`'s tables
        (the web UI). ``what`` completes "could not ..." in error messages.

        Example::

            n = registry.read(lambda c: c.execute(sa.select(sa.func.count()).select_from(
                schema.trials)).scalar_one(), what="count trials")
        """
        return self._db.read(fn, what=what)

    # ---- jobs (ckptstore job run) ---------------------------------------------------------------
    def create_job(
        self, config: Mapping[str, Any], model_dir: str, storage_url: str, name: str | None = None
    ) -> int:
        """Record a new ACTIVE job; returns its id (see :mod:`ckptstore.registry.jobs`)."""
        return self._jobs.create(config, model_dir, storage_url, name)

    def set_job_state(
        self,
        job_id: int,
        state: str | None = None,
        *,
        exit_code: int | None = None,
        log: str | None = None,
    ) -> None:
        """Change a job's state, exit status and/or stored output."""
        self._jobs.update(job_id, state=state, exit_code=exit_code, log=log)

    def get_job(self, job_id: int) -> Job:
        """One job; :class:`~ckptstore.errors.JobNotFound` if there is none."""
        return self._jobs.get(job_id)

    def list_jobs(self) -> list[Job]:
        """Every job, oldest first."""
        return self._jobs.list()

    def add_job_checkpoint(self, job_id: int, uuid: str) -> None:
        """Record that job ``job_id`` loaded checkpoint ``uuid`` (``job describe`` names it)."""
        self._jobs.add_checkpoint(job_id, uuid)

    def add_checkpoint_evaluation(self, uuid: str, evaluation: Mapping[str, Any]) -> None:
        """Record metrics a job measured on checkpoint ``uuid`` (in its ``metrics``)."""
        self._jobs.add_evaluation(uuid, evaluation)

    # ---- experiments --------------------------------------------------------------------------
    def create_experiment(
        self,
        name: str | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        description: str | None = None,
        state: str = "ACTIVE",
    ) -> int:
        """Create an experiment and return its id."""
        check_run_state(state, "experiment")
        now = schema.utcnow()
        values = {
            "name": name,
            "config": dict(config or {}),
            "description": description,
            "state": state,
            "created_at": now,
            "updated_at": now,
        }
        return self._db.write(
            lambda conn: int(conn.execute(_E.insert().values(**values)).inserted_primary_key[0]),
            what="create an experiment",
        )

    def get_experiment(self, experiment_id: int) -> Experiment:
        """The experiment with that id; :class:`~ckptstore.errors.ExperimentNotFound` if none."""

        def fn(conn: sa.Connection) -> Experiment:
            row = conn.execute(sa.select(_E).where(_E.c.id == experiment_id)).first()
            if row is None:
                raise experiment_not_found(experiment_id)
            return experiment_from_row(row)

        return self._db.read(fn, what="get an experiment")

    def list_experiments(self) -> list[Experiment]:
        """All experiments, by id."""
        return self._db.read(
            lambda conn: [
                experiment_from_row(r) for r in conn.execute(sa.select(_E).order_by(_E.c.id))
            ],
            what="list experiments",
        )

    def set_experiment_state(self, experiment_id: int, state: str) -> None:
        """Set an experiment's state (ACTIVE, PAUSED, COMPLETED, CANCELED, ERROR)."""
        check_run_state(state, "experiment")

        def fn(conn: sa.Connection) -> None:
            result = conn.execute(
                _E.update()
                .where(_E.c.id == experiment_id)
                .values(state=state, updated_at=schema.utcnow())
            )
            if result.rowcount == 0:
                raise experiment_not_found(experiment_id)

        self._db.write(fn, what="set an experiment's state")

    def update_experiment(
        self,
        experiment_id: int,
        *,
        name: str | None = None,
        description: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> Experiment:
        """Replace an experiment's name, description and/or config (None leaves it); returns
        the updated experiment. The SDK's ``Experiment.set_name/set_description/set_labels``."""
        values: dict[str, Any] = {"updated_at": schema.utcnow()}
        for key, value, kind in (("name", name, str), ("description", description, str)):
            if value is not None:
                if not isinstance(value, kind):
                    raise errors.InvalidConfig(
                        f"{key} must be a string. Received: {key}={value!r}."
                    )
                values[key] = value
        if config is not None:
            if not isinstance(config, Mapping):
                raise errors.InvalidConfig(f"config must be a dict. Received: {config!r}.")
            values["config"] = dict(config)

        def fn(conn: sa.Connection) -> None:
            result = conn.execute(_E.update().where(_E.c.id == experiment_id).values(**values))
            if result.rowcount == 0:
                raise experiment_not_found(experiment_id)

        self._db.write(fn, what="update an experiment")
        return self.get_experiment(experiment_id)

    # ---- trials -------------------------------------------------------------------------------
    def create_trial(
        self,
        *,
        experiment_id: int | None = None,
        hparams: Mapping[str, Any] | None = None,
        trial_id: int | None = None,
        state: str = "ACTIVE",
    ) -> int:
        """Create a trial (numbered automatically unless ``trial_id`` is given); returns its id."""
        check_run_state(state, "trial")
        if trial_id is not None:
            check_id(trial_id, "trial_id")

        def fn(conn: sa.Connection) -> int:
            if experiment_id is not None:
                self._require_experiment(conn, experiment_id)
            now = schema.utcnow()
            values: dict[str, Any] = {
                "experiment_id": experiment_id,
                "hparams": to_json(dict(hparams or {}), what="hparams"),
                "state": state,
                "created_at": now,
                "updated_at": now,
            }
            if trial_id is None:
                return int(conn.execute(_T.insert().values(**values)).inserted_primary_key[0])
            stmt = self._db.insert(_T).values(id=trial_id, **values).on_conflict_do_nothing()
            if not self._db.inserted(conn, stmt):
                raise errors.RegistryError(
                    f"Trial {trial_id} already exists in registry {self.url}. Use "
                    "ensure_trial(trial_id) to reuse it, or omit trial_id to get a new one."
                )
            self._db.bump_sequence(conn, _T)
            return trial_id

        return self._db.write(fn, what="create a trial")

    def ensure_trial(
        self,
        trial_id: int,
        *,
        experiment_id: int | None = None,
        hparams: Mapping[str, Any] | None = None,
    ) -> Trial:
        """The trial with that id, created (with its experiment, if missing) when absent.
        An existing trial keeps its values; only an unset experiment id is filled in."""
        check_id(trial_id, "trial_id")
        if experiment_id is not None:
            check_id(experiment_id, "experiment_id")

        def fn(conn: sa.Connection) -> Trial:
            self._ensure_trial_row(conn, trial_id, experiment_id, hparams)
            return trial_from_row(conn.execute(sa.select(_T).where(_T.c.id == trial_id)).one())

        return self._db.write(fn, what="ensure a trial")

    def get_trial(self, trial_id: int) -> Trial:
        """The trial with that id; :class:`~ckptstore.errors.TrialNotFound` if none."""

        def fn(conn: sa.Connection) -> Trial:
            row = conn.execute(sa.select(_T).where(_T.c.id == trial_id)).first()
            if row is None:
                raise trial_not_found(trial_id)
            return trial_from_row(row)

        return self._db.read(fn, what="get a trial")

    def list_trials(self, experiment_id: int | None = None) -> list[Trial]:
        """All trials (or an experiment's), by id."""
        query = sa.select(_T).order_by(_T.c.id)
        if experiment_id is not None:
            query = query.where(_T.c.experiment_id == experiment_id)
        return self._db.read(
            lambda conn: [trial_from_row(r) for r in conn.execute(query)], what="list trials"
        )

    def set_trial_state(self, trial_id: int, state: str) -> None:
        """Set a trial's state (ACTIVE, COMPLETED, ERROR, CANCELED, PAUSED)."""
        check_run_state(state, "trial")

        def fn(conn: sa.Connection) -> None:
            result = conn.execute(
                _T.update()
                .where(_T.c.id == trial_id)
                .values(state=state, updated_at=schema.utcnow())
            )
            if result.rowcount == 0:
                raise trial_not_found(trial_id)

        self._db.write(fn, what="set a trial's state")

    def delete_trial(self, trial_id: int) -> None:
        """Remove a trial, its metrics and DELETED checkpoint rows (refused while others live)."""
        self._db.write(lambda conn: delete_trial_rows(conn, trial_id), what="delete a trial")

    def trial_heartbeat(self, trial_id: int) -> None:
        """Record that the trial's process is alive (the chief of ``core.init`` calls it every
        :data:`~ckptstore.registry.entities.HEARTBEAT_SECONDS`; ``Trial.status`` reads it)."""
        update = _T.update().where(_T.c.id == trial_id).values(heartbeat_at=schema.utcnow())
        self._db.write(lambda conn: conn.execute(update), what="record a trial heartbeat")

    # ---- metrics ------------------------------------------------------------------------------
    def report_metrics(
        self, trial_id: int, group: str, steps_completed: int, metrics: Mapping[str, Any]
    ) -> None:
        """Record metrics a trial reported at ``steps_completed`` under ``group``
        (``"training"``, ``"validation"`` or any other name)."""
        if not isinstance(group, str) or not group:
            raise errors.InvalidConfig(
                f"Metric group must be a non-empty string such as 'training' or 'validation'. "
                f"Received: group={group!r}"
            )
        check_steps(steps_completed)
        if not isinstance(metrics, Mapping):
            raise errors.InvalidConfig(
                f"metrics must be a dict of name -> value. Received: {type(metrics).__name__}"
            )
        clean = to_json(dict(metrics), what="metrics")

        def fn(conn: sa.Connection) -> None:
            self._require_trial(conn, trial_id)
            conn.execute(
                _M.insert().values(
                    trial_id=trial_id,
                    group=group,
                    steps_completed=int(steps_completed),
                    metrics=clean,
                    reported_at=schema.utcnow(),
                )
            )

        self._db.write(fn, what="report metrics")

    def get_metrics(self, trial_id: int, group: str | None = None) -> list[MetricRow]:
        """A trial's reported metrics (optionally one group), ordered by steps."""

        def fn(conn: sa.Connection) -> list[MetricRow]:
            self._require_trial(conn, trial_id)
            query = sa.select(_M).where(_M.c.trial_id == trial_id)
            if group is not None:
                query = query.where(_M.c.group == group)
            query = query.order_by(_M.c.steps_completed, _M.c.id)
            return [
                MetricRow(
                    trial_id=r.trial_id,
                    group=r.group,
                    steps_completed=int(r.steps_completed),
                    metrics=dict(r.metrics),
                    reported_at=schema.from_db_time(r.reported_at),
                )
                for r in conn.execute(query)
            ]

        return self._db.read(fn, what="get metrics")

    # ---- checkpoints (CheckpointIndex protocol) -----------------------------------------------
    def record_checkpoint(self, record: CheckpointRecord) -> None:
        """Insert or update (by uuid) a checkpoint; creates its trial/experiment rows if
        missing."""
        values = checkpoint_values(record)

        def fn(conn: sa.Connection) -> None:
            self.upsert_checkpoint_row(conn, record, values)

        self._db.write(fn, what="record a checkpoint")

    def set_checkpoint_state(
        self, uuid: str, state: str, resources: dict[str, int] | None = None
    ) -> None:
        """Change a checkpoint's state (and resource list, after a partial delete)."""
        check_checkpoint_state(state)
        values: dict[str, Any] = {"state": state, "updated_at": schema.utcnow()}
        if resources is not None:
            values["resources"] = {str(k): int(v) for k, v in resources.items()}

        def fn(conn: sa.Connection) -> None:
            result = conn.execute(_C.update().where(_C.c.uuid == uuid).values(**values))
            if result.rowcount == 0:
                raise checkpoint_not_found(uuid)

        self._db.write(fn, what="set a checkpoint's state")

    def checkpoint_records(
        self,
        *,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        states: tuple[str, ...] | None = _LIVE_STATES,
    ) -> list[CheckpointRecord]:
        """Checkpoints filtered by trial/experiment and state, oldest first by
        (steps_completed, created_at)."""
        return [
            c.to_record()
            for c in self.list_checkpoints(
                trial_id=trial_id, experiment_id=experiment_id, states=states
            )
        ]

    def protected_checkpoint_uuids(self) -> set[str]:
        """UUIDs GC must never delete: registered as a model version, or pinned by an
        unexpired pin (:meth:`pin_checkpoint`)."""
        return self._models.protected_uuids() | self._pins.pinned_uuids()

    # ---- pins (PinningIndex protocol) ---------------------------------------------------------
    def pin_checkpoint(
        self, uuid: str, holder: str, expires_at: _dt.datetime | None = None
    ) -> None:
        """Keep GC (in any process using this registry) from deleting checkpoint ``uuid``
        until ``expires_at`` (aware, or naive UTC; None: until :meth:`unpin_checkpoint`).
        Pinning again with the same ``holder`` renews the pin. The checkpoint need not be in
        the registry. ``CheckpointContext.protect()`` and ``restore_path()`` call this."""
        self._pins.pin(uuid, holder, expires_at)

    def unpin_checkpoint(self, uuid: str, holder: str) -> None:
        """Remove ``holder``'s pin on ``uuid`` (no error if there is none)."""
        self._pins.unpin(uuid, holder)

    def list_pins(self, uuid: str | None = None, *, include_expired: bool = False) -> list[Pin]:
        """Pins (of one checkpoint, or all), by uuid then holder; expired ones only if asked."""
        return self._pins.list_pins(uuid, include_expired)

    # ---- search slots (several experiment runners on one search) ------------------------------
    def ensure_slot_trial(
        self,
        experiment_id: int,
        slot: int,
        hparams: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    ) -> int:
        """The id of the trial filling the searcher's ``slot`` of the experiment, created (ACTIVE,
        with ``hparams``) when the slot has none. Atomic: runners racing on one slot get the
        same trial, so a slot whose runner died and that another runner retries never gets a
        second trial. ``hparams`` may be a function, called only when the trial is created.

        Example::

            trial_id = registry.ensure_slot_trial(3, slot=0, hparams={"lr": 0.1})
        """
        check_id(experiment_id, "experiment_id")
        int_at_least("slot", slot, 0)

        def existing(conn: sa.Connection) -> int | None:
            query = sa.select(_T.c.id).where(
                _T.c.experiment_id == experiment_id, _T.c.search_slot == slot
            )
            found = conn.execute(query).scalar()
            return None if found is None else int(found)

        def fn(conn: sa.Connection) -> int:
            self._require_experiment(conn, experiment_id)
            found = existing(conn)
            if found is not None:
                return found
            values = hparams() if callable(hparams) else hparams
            if not isinstance(values, Mapping):
                raise errors.InvalidConfig(
                    f"hparams must be a dict. Received: {type(values).__name__}"
                )
            now = schema.utcnow()
            stmt = (
                self._db.insert(_T)
                .values(
                    experiment_id=experiment_id,
                    search_slot=slot,
                    hparams=dict(values),
                    state="ACTIVE",
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing()
            )
            conn.execute(stmt)
            found = existing(conn)  # ours, or the one a racing runner committed first
            assert found is not None
            return found

        return self._db.write(fn, what="create a search slot's trial")

    def run_exclusive(self, experiment_id: int, fn: Callable[[], T], *, what: str) -> T:
        """``fn()`` while holding the experiment's row lock: of the processes (on any machine)
        calling this for one experiment, one at a time. ``fn`` may run again if the transaction
        is retried, so it must be idempotent; it must not write the registry itself.

        Example::

            registry.run_exclusive(3, lambda: queue.enqueue_missing(), what="fill the queue")
        """

        def body(conn: sa.Connection) -> T:
            locked = conn.execute(
                sa.select(_E.c.id).where(_E.c.id == experiment_id).with_for_update()
            ).first()
            if locked is None:  # SQLite: the write transaction itself serialises callers
                raise experiment_not_found(experiment_id)
            return fn()

        return self._db.write(body, what=what)

    # ---- models -------------------------------------------------------------------------------
    def create_model(
        self,
        name: str,
        description: str = "",
        labels: Iterable[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Model:
        """Create a registered model; :class:`~ckptstore.errors.ModelVersionConflict` if the
        name is taken."""
        return self._models.create(name, description, labels, metadata)

    def get_model(self, name: str) -> Model:
        """The registered model; :class:`~ckptstore.errors.ModelNotFound` if none."""
        return self._models.get(name)

    def list_models(self, include_archived: bool = False) -> list[Model]:
        """Registered models by name (archived ones only if asked)."""
        return self._models.list(include_archived)

    # ---- storage is the source of truth -------------------------------------------------------
    def reindex(self, storage: Storage, *, skipped: dict[str, str] | None = None) -> int:
        """Rebuild checkpoint/trial/experiment rows from ``storage``; see
        :func:`ckptstore.registry.reindex.reindex`. Returns the number of checkpoints indexed;
        damaged ones are left out and added to ``skipped`` (``{uuid: why}``) when given."""
        from ckptstore.registry.reindex import reindex

        return reindex(self, storage, skipped=skipped)

    # ---- helpers shared with reindex/models ---------------------------------------------------
    def upsert_checkpoint_row(
        self, conn: sa.Connection, record: CheckpointRecord, values: dict[str, Any]
    ) -> None:
        if record.experiment_id is not None:
            self._ensure_experiment_row(conn, record.experiment_id)
        if record.trial_id is not None:
            self._ensure_trial_row(conn, record.trial_id, record.experiment_id, None)
        update = {k: v for k, v in values.items() if k != "uuid"}
        if record.created_at is None:
            update.pop("created_at")
        stmt = self._db.insert(_C).values(**values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[_C.c.uuid], set_=update))

    def _ensure_experiment_row(self, conn: sa.Connection, experiment_id: int) -> None:
        now = schema.utcnow()
        stmt = (
            self._db.insert(_E)
            .values(
                id=experiment_id,
                name=None,
                config={},
                description=None,
                state="ACTIVE",
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing()
        )
        if self._db.inserted(conn, stmt):
            self._db.bump_sequence(conn, _E)

    def _ensure_trial_row(
        self,
        conn: sa.Connection,
        trial_id: int,
        experiment_id: int | None,
        hparams: Mapping[str, Any] | None,
    ) -> None:
        if experiment_id is not None:
            self._ensure_experiment_row(conn, experiment_id)
        now = schema.utcnow()
        stmt = (
            self._db.insert(_T)
            .values(
                id=trial_id,
                experiment_id=experiment_id,
                hparams=dict(hparams or {}),
                state="ACTIVE",
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing()
        )
        if self._db.inserted(conn, stmt):
            self._db.bump_sequence(conn, _T)
        elif experiment_id is not None:
            conn.execute(
                _T.update()
                .where(_T.c.id == trial_id, _T.c.experiment_id.is_(None))
                .values(experiment_id=experiment_id, updated_at=now)
            )

    def _require_trial(self, conn: sa.Connection, trial_id: int) -> None:
        if conn.execute(sa.select(_T.c.id).where(_T.c.id == trial_id)).first() is None:
            raise trial_not_found(trial_id)

    def _require_experiment(self, conn: sa.Connection, experiment_id: int) -> None:
        if conn.execute(sa.select(_E.c.id).where(_E.c.id == experiment_id)).first() is None:
            raise experiment_not_found(experiment_id)


def open_registry(registry: Registry | str | None = None) -> Registry:
    """A :class:`Registry` from a URL, None (the default registry) or an open registry
    (returned as is)."""
    if isinstance(registry, Registry):
        return registry
    if registry is None or isinstance(registry, str):
        return Registry(registry)
    if hasattr(registry, "__fspath__"):
        return Registry(str(registry.__fspath__()))
    raise errors.InvalidConfig(
        "registry must be a URL string, a path, None or a ckptstore.registry.Registry. "
        f"Received: {type(registry).__name__}"
    )
