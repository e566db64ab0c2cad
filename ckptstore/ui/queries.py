"""The UI's reads: every list is one paged, sorted and filtered SQL query over the registry.

Nothing here loads a whole table into Python: pages come back with ``LIMIT``/``OFFSET`` and a
``COUNT`` of the filtered rows, and per-trial figures (best / latest searcher metric, steps,
checkpoint counts) are computed by the database. JSON metric values are read with SQLAlchemy's
JSON index + ``as_float()``, which renders ``json_extract`` on SQLite and ``->>`` on
PostgreSQL.

Example::

    from ckptstore.registry import Registry
    from ckptstore.ui import queries

    with Registry("sqlite:///reg.db") as registry:
        page = queries.experiment_trials(registry, 1, queries.TrialFilter(state="COMPLETED"))
        print(page.total, [row["id"] for row in page.rows])
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from ckptstore import errors
from ckptstore.checkpointing.index import LIVE_STATES as _LIVE_STATES
from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.masking import mask_value
from ckptstore.registry import Registry, schema
from ckptstore.registry.entities import trial_status

_E = schema.experiments
_T = schema.trials
_C = schema.checkpoints
_M = schema.metrics
_MO = schema.models
_V = schema.model_versions
_A = schema.model_aliases
_P = schema.checkpoint_pins

logger = logging.getLogger(__name__)

LIVE_STATES = _LIVE_STATES  # one owner: ckptstore.checkpointing.index
PAGE_SIZE = 50
#: Columns the trials table sorts by (query value -> label).
TRIAL_SORTS = ("id", "state", "best", "latest", "steps", "checkpoints")


@dataclasses.dataclass
class Page:
    """One page of a list: ``rows`` plus what the pager needs."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


@dataclasses.dataclass
class Searcher:
    """The metric an experiment optimizes and its direction (from its config)."""

    name: str
    metric: str
    smaller_is_better: bool

    @staticmethod
    def of(config: Any) -> Searcher:
        """From a stored config, whatever it holds: one experiment's odd row (written before
        the registry checked values, or by hand) must not break a page that lists others."""
        searcher = config.get("searcher") if isinstance(config, dict) else None
        if not isinstance(searcher, dict):
            searcher = {}
        return Searcher(
            name=str(searcher.get("name") or "single"),
            # The metric name is bound into SQL as a JSON path, and PostgreSQL cannot bind a
            # NUL: such a name matches nothing (shown with U+FFFD) instead of failing the query.
            metric=str(searcher.get("metric") or "val_loss").replace("\x00", "\ufffd"),
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
        )


@dataclasses.dataclass
class TrialFilter:
    """Sort and filter of an experiment's trials table (bad values were rejected earlier)."""

    state: str | None = None
    min_metric: float | None = None
    max_metric: float | None = None
    sort: str = "id"
    descending: bool = False
    page: int = 1


def _shown(row: sa.Row[Any]) -> dict[str, Any]:
    """A row as pages may show it: every value through the one masking rule (hparams such as
    ``api_key``, descriptions and URLs with passwords)."""
    return mask_value(dict(row._mapping))


def _trial_shown(row: sa.Row[Any]) -> dict[str, Any]:
    """A trials row as pages show it, with its ``status`` (LOST for a dead ACTIVE one)."""
    shown = _shown(row)
    shown["status"] = trial_status(row.state, schema.from_db_time(row.heartbeat_at))
    return shown


def _offset(page: int, size: int) -> int:
    return (max(page, 1) - 1) * size


def metric_value(column: Any, metric: str) -> Any:
    """SQL for ``metric`` in a metrics JSON column by the rule of
    :func:`ckptstore.checkpointing.metrics.metric_value`: the names ``metric``, ``val_metric``
    and ``metric`` without ``val_``, each looked up flat, then under ``validation_metrics`` and
    ``avg_metrics`` (other nested dicts, which that rule also tries, are not searched in SQL)."""
    names = list(dict.fromkeys([metric, f"val_{metric}", metric.removeprefix("val_")]))
    places = [
        path
        for name in names
        for path in (
            column[name],
            column[("validation_metrics", name)],
            column[("avg_metrics", name)],
        )
    ]
    return sa.func.coalesce(*[path.as_float() for path in places])


# ---- experiments -------------------------------------------------------------------------------
def experiments_page(
    registry: Registry, page: int = 1, state: str | None = None, size: int = PAGE_SIZE
) -> Page:
    """Experiments, newest first, with trial counts by state and the best searcher metric."""
    try:
        return _experiments_page(registry, page, state, size, guarded=False)
    except errors.RegistryError:
        # One experiment's metric rows may break the JSON operators (a "\u0000" written before
        # the registry refused it): again, each best value alone, an odd one shown as blank.
        return _experiments_page(registry, page, state, size, guarded=True)


def _best_value(conn: sa.Connection, query: Any, guarded: bool) -> Any:
    if not guarded:
        return conn.execute(query).scalar()
    try:
        with conn.begin_nested():  # a SAVEPOINT: on PostgreSQL an error aborts the transaction
            return conn.execute(query).scalar()
    except sa_exc.DBAPIError as exc:
        logger.warning("Experiments page: a best metric value could not be read: %s", exc.orig)
        return None


def _experiments_page(
    registry: Registry, page: int, state: str | None, size: int, *, guarded: bool
) -> Page:
    where = [] if state is None else [_E.c.state == state]

    def fn(conn: sa.Connection) -> Page:
        total = conn.execute(sa.select(sa.func.count()).select_from(_E).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(_E)
            .where(*where)
            .order_by(_E.c.id.desc())
            .limit(size)
            .offset(_offset(page, size))
        ).all()
        ids = [r.id for r in rows]
        counts: dict[int, dict[str, int]] = {i: {} for i in ids}
        for exp_id, trial_state, n in conn.execute(
            sa.select(_T.c.experiment_id, _T.c.state, sa.func.count())
            .where(_T.c.experiment_id.in_(ids))
            .group_by(_T.c.experiment_id, _T.c.state)
        ):
            counts[exp_id][trial_state] = n
        out = []
        for r in rows:
            searcher = Searcher.of(r.config)
            value = report_value(_M.c.metrics, searcher.metric)
            best = sa.func.min(value) if searcher.smaller_is_better else sa.func.max(value)
            best_value = _best_value(
                conn,
                sa.select(best)
                .select_from(_M.join(_T, _T.c.id == _M.c.trial_id))
                .where(_T.c.experiment_id == r.id, _M.c.group == "validation"),
                guarded,
            )
            out.append(
                {
                    "id": r.id,
                    "name": r.name,
                    "state": r.state,
                    "searcher": searcher,
                    "trials": counts[r.id],
                    "n_trials": sum(counts[r.id].values()),
                    "best": best_value,
                    "created_at": schema.from_db_time(r.created_at),
                }
            )
        return Page(out, total, page, size)

    return registry.read(fn, what="list experiments")


def report_value(column: Any, metric: str) -> Any:
    """SQL for ``metric`` in a *reported* metrics row (flat: ``report_*_metrics`` take a flat
    dict), with or without the ``val_`` prefix, as the searcher reads it."""
    names = list(dict.fromkeys([metric, f"val_{metric}", metric.removeprefix("val_")]))
    return sa.func.coalesce(*[column[name].as_float() for name in names])


def _trial_stats(experiment_id: int, searcher: Searcher, *, steps: bool = False) -> Any:
    """Per trial of the experiment, in one grouped pass over its metric rows: the best
    validation value of the searcher metric, and with ``steps`` the most steps reported (which
    needs the training rows too; without it only validation rows are read)."""
    value = report_value(_M.c.metrics, searcher.metric)
    where = [_T.c.experiment_id == experiment_id]
    if steps:
        value = sa.case((_M.c.group == "validation", value))
    else:
        where.append(_M.c.group == "validation")
    best = sa.func.min(value) if searcher.smaller_is_better else sa.func.max(value)
    columns = [_M.c.trial_id.label("trial_id"), best.label("best")]
    if steps:
        columns.append(sa.func.max(_M.c.steps_completed).label("steps"))
    return (
        sa.select(*columns)
        .select_from(_M.join(_T, _T.c.id == _M.c.trial_id))
        .where(*where)
        .group_by(_M.c.trial_id)
        .subquery("stats")
    )


def _latest(searcher: Searcher) -> Any:
    """The trial's newest validation value of the searcher metric (correlated to trials)."""
    value = report_value(_M.c.metrics, searcher.metric)
    return (
        sa.select(value)
        .where(_M.c.trial_id == _T.c.id, _M.c.group == "validation", value.is_not(None))
        .order_by(_M.c.steps_completed.desc(), _M.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


def _checkpoint_count() -> Any:
    return (
        sa.select(sa.func.count())
        .select_from(_C)
        .where(_C.c.trial_id == _T.c.id, _C.c.state.in_(LIVE_STATES))
        .scalar_subquery()
    )


def _checkpoint_counts(experiment_id: int) -> Any:
    """Live checkpoints per trial of the experiment, in one grouped pass."""
    return (
        sa.select(_C.c.trial_id.label("trial_id"), sa.func.count().label("n"))
        .where(_C.c.experiment_id == experiment_id, _C.c.state.in_(LIVE_STATES))
        .group_by(_C.c.trial_id)
        .subquery("counts")
    )


def experiment_trials(
    registry: Registry, experiment_id: int, flt: TrialFilter, searcher: Searcher
) -> Page:
    """One page of an experiment's trials table, sorted and filtered in SQL.

    Two queries: the page's trial ids with the filtered total (a grouped pass over the metrics
    or checkpoints only when the sort or a metric range needs it), then the columns of those
    <= PAGE_SIZE trials."""
    source: Any = _T
    where = [_T.c.experiment_id == experiment_id]
    if flt.state:
        where.append(_T.c.state == flt.state)
    key: Any = {"id": _T.c.id, "state": _T.c.state}.get(flt.sort)
    stats = None
    if flt.sort in ("best", "steps") or flt.min_metric is not None or flt.max_metric is not None:
        stats = _trial_stats(experiment_id, searcher, steps=flt.sort == "steps")
        source = source.outerjoin(stats, stats.c.trial_id == _T.c.id)
        if flt.min_metric is not None:
            where.append(stats.c.best >= flt.min_metric)
        if flt.max_metric is not None:
            where.append(stats.c.best <= flt.max_metric)
        if flt.sort in ("best", "steps"):
            key = stats.c[flt.sort]
    if flt.sort == "checkpoints":
        counts = _checkpoint_counts(experiment_id)
        source = source.outerjoin(counts, counts.c.trial_id == _T.c.id)
        key = sa.func.coalesce(counts.c.n, 0)
    elif flt.sort == "latest":
        key = _latest(searcher)
    keyed = (
        sa.select(_T.c.id.label("id"), key.label("k"), sa.func.count().over().label("total"))
        .select_from(source)
        .where(*where)
        .subquery("keyed")
    )
    order = keyed.c.k.desc() if flt.descending else keyed.c.k.asc()
    # Trials without a value (no metric yet) come last in both directions.
    ids_query = (
        sa.select(keyed.c.id, keyed.c.total)
        .order_by(keyed.c.k.is_(None), order, keyed.c.id)
        .limit(PAGE_SIZE)
        .offset(_offset(flt.page, PAGE_SIZE))
    )

    def fn(conn: sa.Connection) -> Page:
        rows = conn.execute(ids_query).all()
        if rows:
            total = rows[0].total
        else:  # past the last page: count without the window
            total = conn.execute(
                sa.select(sa.func.count()).select_from(source).where(*where)
            ).scalar_one()
        ids = [r.id for r in rows]
        details = sa.select(
            _T,
            _best(searcher).label("best"),
            sa.select(sa.func.max(_M.c.steps_completed))
            .where(_M.c.trial_id == _T.c.id)
            .scalar_subquery()
            .label("steps"),
            _latest(searcher).label("latest"),
            _checkpoint_count().label("checkpoints"),
        ).where(_T.c.id.in_(ids))
        found = {r.id: _trial_shown(r) for r in conn.execute(details)}
        return Page([found[i] for i in ids if i in found], total, flt.page, PAGE_SIZE)

    return registry.read(fn, what="list an experiment's trials")


def _best(searcher: Searcher) -> Any:
    """The trial's best validation value of the searcher metric (correlated to trials)."""
    value = report_value(_M.c.metrics, searcher.metric)
    best = sa.func.min(value) if searcher.smaller_is_better else sa.func.max(value)
    return (
        sa.select(best)
        .where(_M.c.trial_id == _T.c.id, _M.c.group == "validation")
        .scalar_subquery()
    )


def experiment_points(
    registry: Registry,
    experiment_id: int,
    searcher: Searcher,
    curves: dict[int, list[tuple[float, float]]],
) -> list[dict[str, Any]]:
    """``[{id, hparams, best}]`` of every trial with a searcher metric (for the charts), the
    best taken from ``curves`` (:func:`experiment_curves`: the same validation values the SQL
    best of the trials table reads), so the metric rows are scanned once per view."""
    pick = min if searcher.smaller_is_better else max
    query = (
        sa.select(_T.c.id, _T.c.hparams)
        .where(_T.c.experiment_id == experiment_id)
        .order_by(_T.c.id)
    )

    def fn(conn: sa.Connection) -> list[dict[str, Any]]:
        return [
            mask_value({"id": i, "hparams": h, "best": pick(v for _, v in curves[i])})
            for i, h in conn.execute(query)
            if curves.get(i)
        ]

    return registry.read(fn, what="chart an experiment's trials")


def experiment_curves(
    registry: Registry, experiment_id: int, searcher: Searcher
) -> dict[int, list[tuple[float, float]]]:
    """``{trial id: [(steps, value), ...]}``: every validation value of the searcher metric of
    every trial of the experiment (one query; only the number leaves the database)."""
    value = report_value(_M.c.metrics, searcher.metric)
    query = (
        sa.select(_M.c.trial_id, _M.c.steps_completed, value.label("value"))
        .select_from(_M.join(_T, _T.c.id == _M.c.trial_id))
        .where(_T.c.experiment_id == experiment_id, _M.c.group == "validation")
        .order_by(_M.c.trial_id, _M.c.steps_completed)
    )

    def fn(conn: sa.Connection) -> dict[int, list[tuple[float, float]]]:
        curves: dict[int, list[tuple[float, float]]] = {}
        for trial_id, steps, number in conn.execute(query):
            if number is not None:
                curves.setdefault(trial_id, []).append((float(steps), float(number)))
        return curves

    return registry.read(fn, what="read an experiment's searcher metric curves")


def experiment_stamp(registry: Registry, experiment_id: int) -> str:
    """Changes whenever a trial of the experiment reports metrics (an index-only count, cheap
    enough to ask on every view; the charts are cached under it)."""
    query = (
        sa.select(sa.func.count(), sa.func.max(_M.c.id))
        .select_from(_M.join(_T, _T.c.id == _M.c.trial_id))
        .where(_T.c.experiment_id == experiment_id)
    )
    return registry.read(
        lambda conn: "|".join(str(v) for v in conn.execute(query).one()),
        what="check an experiment for new metrics",
    )


# ---- trials ------------------------------------------------------------------------------------
def _newest_metrics(group: str) -> Any:
    """The metrics dict of the trial's newest report in ``group`` (correlated to trials; one
    index range of ix_metrics_trial_group_steps)."""
    return (
        sa.select(_M.c.metrics)
        .where(_M.c.trial_id == _T.c.id, _M.c.group == group)
        .order_by(_M.c.steps_completed.desc(), _M.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


def _last_checkpoint(column: Any) -> Any:
    """``column`` of the trial's newest live checkpoint (correlated to trials)."""
    return (
        sa.select(column)
        .where(_C.c.trial_id == _T.c.id, _C.c.state.in_(LIVE_STATES))
        .order_by(_C.c.steps_completed.desc(), _C.c.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )


def script_runs_page(registry: Registry, page: int = 1, state: str | None = None) -> Page:
    """Trials that belong to no experiment (script runs: ``core.init`` with or without a trial
    id), newest first, with their newest training and validation metrics and last live
    checkpoint: two queries, the second over one page of trials."""
    where = [_T.c.experiment_id.is_(None)]
    if state:
        where.append(_T.c.state == state)

    def fn(conn: sa.Connection) -> Page:
        total = conn.execute(sa.select(sa.func.count()).select_from(_T).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(
                _T,
                _newest_metrics("training").label("training"),
                _newest_metrics("validation").label("validation"),
                _last_checkpoint(_C.c.uuid).label("last_uuid"),
                _last_checkpoint(_C.c.steps_completed).label("last_steps"),
            )
            .where(*where)
            .order_by(_T.c.id.desc())
            .limit(PAGE_SIZE)
            .offset(_offset(page, PAGE_SIZE))
        )
        return Page([_trial_shown(r) for r in rows], total, page, PAGE_SIZE)

    return registry.read(fn, what="list script runs")


def trial_stamp(registry: Registry, trial_id: int) -> str:
    """A short string that changes whenever the trial's state, metrics or checkpoints do (the
    live pages poll it)."""

    def fn(conn: sa.Connection) -> str:
        state, updated = conn.execute(
            sa.select(_T.c.state, _T.c.updated_at).where(_T.c.id == trial_id)
        ).one_or_none() or ("", None)
        n_metrics, last_metric = conn.execute(
            sa.select(sa.func.count(), sa.func.max(_M.c.id)).where(_M.c.trial_id == trial_id)
        ).one()
        n_ckpts, last_ckpt = conn.execute(
            sa.select(sa.func.count(), sa.func.max(_C.c.updated_at)).where(
                _C.c.trial_id == trial_id
            )
        ).one()
        return f"{state}|{updated}|{n_metrics}|{last_metric}|{n_ckpts}|{last_ckpt}"

    return registry.read(fn, what="check a trial for changes")


def trial_checkpoints(
    registry: Registry, trial_id: int, page: int = 1, states: Sequence[str] | None = None
) -> Page:
    """One page of a trial's checkpoints, newest first."""
    where = [_C.c.trial_id == trial_id]
    if states:
        where.append(_C.c.state.in_(tuple(states)))

    def fn(conn: sa.Connection) -> Page:
        total = conn.execute(sa.select(sa.func.count()).select_from(_C).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(_C)
            .where(*where)
            .order_by(_C.c.steps_completed.desc(), _C.c.created_at.desc())
            .limit(PAGE_SIZE)
            .offset(_offset(page, PAGE_SIZE))
        )
        return Page([_shown(r) for r in rows], total, page, PAGE_SIZE)

    return registry.read(fn, what="list a trial's checkpoints")


def live_checkpoints(registry: Registry, trial_id: int) -> list[dict[str, Any]]:
    """The trial's committed checkpoints, oldest first, with the fields retention looks at."""

    def fn(conn: sa.Connection) -> list[dict[str, Any]]:
        rows = conn.execute(
            sa.select(_C.c.uuid, _C.c.steps_completed, _C.c.metrics, _C.c.created_at)
            .where(_C.c.trial_id == trial_id, _C.c.state.in_(LIVE_STATES))
            .order_by(_C.c.steps_completed, _C.c.created_at, _C.c.uuid)
        )
        return [_shown(r) for r in rows]

    return registry.read(fn, what="list a trial's live checkpoints")


def experiment_best(
    registry: Registry, experiment_id: int, metric: str, smaller_is_better: bool, n: int
) -> list[CheckpointRecord]:
    """The experiment's ``n`` best live checkpoints by ``metric`` (the pool of the
    ``save_experiment_best`` rule), found with ORDER BY ... LIMIT in SQL."""
    if n <= 0:
        return []
    value = metric_value(_C.c.metrics, metric)

    def fn(conn: sa.Connection) -> list[CheckpointRecord]:
        query = (
            sa.select(_C.c.uuid, _C.c.steps_completed, _C.c.metrics)
            .where(_C.c.experiment_id == experiment_id, _C.c.state.in_(LIVE_STATES))
            .where(value.is_not(None))
            .order_by(
                value.asc() if smaller_is_better else value.desc(), _C.c.steps_completed.desc()
            )
            .limit(n)
        )
        return [
            CheckpointRecord(uuid=r.uuid, steps_completed=r.steps_completed, metrics=r.metrics)
            for r in conn.execute(query)
        ]

    return registry.read(fn, what="find an experiment's best checkpoints")


def versions_of(registry: Registry, uuids: Iterable[str]) -> dict[str, list[str]]:
    """``{checkpoint uuid: ["model:version", ...]}`` for the given checkpoints only."""
    uuids = list(uuids)

    def fn(conn: sa.Connection) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        rows = conn.execute(
            sa.select(_V.c.checkpoint_uuid, _MO.c.name, _V.c.version)
            .join(_MO, _MO.c.id == _V.c.model_id)
            .where(_V.c.checkpoint_uuid.in_(uuids))
            .order_by(_MO.c.name, _V.c.version)
        )
        for uuid, name, version in rows:
            found.setdefault(uuid, []).append(f"{name}:{version}")
        return found

    return registry.read(fn, what="find model versions of checkpoints") if uuids else {}


def pins_of(registry: Registry, uuids: Iterable[str]) -> dict[str, list[str]]:
    """``{checkpoint uuid: [holder, ...]}`` of unexpired pins on the given checkpoints."""
    uuids = list(uuids)
    now = schema.utcnow()

    def fn(conn: sa.Connection) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        rows = conn.execute(
            sa.select(_P.c.checkpoint_uuid, _P.c.holder).where(
                _P.c.checkpoint_uuid.in_(uuids),
                sa.or_(_P.c.expires_at.is_(None), _P.c.expires_at > now),
            )
        )
        for uuid, holder in rows:
            found.setdefault(uuid, []).append(holder)
        return found

    return registry.read(fn, what="find pins of checkpoints") if uuids else {}


# ---- checkpoints and models --------------------------------------------------------------------
def checkpoints_page(
    registry: Registry, page: int = 1, state: str | None = None, trial_id: int | None = None
) -> Page:
    """All checkpoints, newest first, optionally of one state or trial."""
    where = []
    if state:
        where.append(_C.c.state == state)
    if trial_id is not None:
        where.append(_C.c.trial_id == trial_id)
    cols = [_C.c[n] for n in ("uuid", "trial_id", "experiment_id", "steps_completed", "state")]

    def fn(conn: sa.Connection) -> Page:
        total = conn.execute(sa.select(sa.func.count()).select_from(_C).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(*cols, _C.c.created_at)
            .where(*where)
            # The order of ix_checkpoints_trial_steps_created: deep pages need no sort.
            .order_by(_C.c.trial_id.desc(), _C.c.steps_completed.desc(), _C.c.created_at.desc())
            .limit(PAGE_SIZE)
            .offset(_offset(page, PAGE_SIZE))
        )
        return Page([_shown(r) for r in rows], total, page, PAGE_SIZE)

    return registry.read(fn, what="list checkpoints")


def previous_checkpoint(registry: Registry, trial_id: int, steps: int, uuid: str) -> str | None:
    """The UUID of the trial's live checkpoint just before ``uuid`` (fewer steps, or as many
    and older): what a checkpoint's page compares it with."""
    query = (
        sa.select(_C.c.uuid)
        .where(
            _C.c.trial_id == trial_id,
            _C.c.state.in_(LIVE_STATES),
            _C.c.steps_completed <= steps,
            _C.c.uuid != uuid,
        )
        .order_by(_C.c.steps_completed.desc(), _C.c.created_at.desc())
        .limit(1)
    )
    return registry.read(
        lambda conn: conn.execute(query).scalar(), what="find the previous checkpoint"
    )


def models_page(registry: Registry, page: int = 1) -> Page:
    """Registered models by name, with their number of versions and aliases."""
    n_versions = (
        sa.select(sa.func.count()).where(_V.c.model_id == _MO.c.id).scalar_subquery().label("n")
    )

    def fn(conn: sa.Connection) -> Page:
        total = conn.execute(sa.select(sa.func.count()).select_from(_MO)).scalar_one()
        rows = conn.execute(
            sa.select(_MO, n_versions)
            .order_by(_MO.c.name)
            .limit(PAGE_SIZE)
            .offset(_offset(page, PAGE_SIZE))
        )
        return Page([_shown(r) for r in rows], total, page, PAGE_SIZE)

    return registry.read(fn, what="list models")


def model_versions_page(registry: Registry, name: str, page: int = 1) -> Page:
    """One page of a model's versions, newest first, with their aliases."""

    def fn(conn: sa.Connection) -> Page:
        model_id = conn.execute(sa.select(_MO.c.id).where(_MO.c.name == name)).scalar()
        where = [_V.c.model_id == model_id]
        total = conn.execute(sa.select(sa.func.count()).select_from(_V).where(*where)).scalar_one()
        rows = [
            _shown(r)
            for r in conn.execute(
                # Each version with its source: the checkpoint's trial, steps and metrics.
                sa.select(
                    _V,
                    _C.c.trial_id,
                    _C.c.experiment_id,
                    _C.c.steps_completed,
                    _C.c.metrics.label("checkpoint_metrics"),
                )
                .outerjoin(_C, _C.c.uuid == _V.c.checkpoint_uuid)
                .where(*where)
                .order_by(_V.c.version.desc())
                .limit(PAGE_SIZE)
                .offset(_offset(page, PAGE_SIZE))
            )
        ]
        aliases: dict[int, list[str]] = {}
        for version_id, alias in conn.execute(
            sa.select(_A.c.version_id, _A.c.alias).where(_A.c.model_id == model_id)
        ):
            aliases.setdefault(version_id, []).append(alias)
        for row in rows:
            row["aliases"] = sorted(aliases.get(row["id"], []))
        return Page(rows, total, page, PAGE_SIZE)

    return registry.read(fn, what="list a model's versions")
