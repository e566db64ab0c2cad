"""Checkpoint queries of the :class:`~ckptstore.registry.registry.Registry` under the
Determined SDK's names: one checkpoint, a list, a trial's latest, and the best by a metric
(the experiment config's ``searcher.metric`` by default, ranked by
:func:`~ckptstore.checkpointing.metrics.rank_by_metric`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.checkpointing.index import LIVE_STATES
from ckptstore.checkpointing.metrics import rank_by_metric
from ckptstore.registry import schema
from ckptstore.registry.db import Database
from ckptstore.registry.entities import Checkpoint, Experiment, Trial
from ckptstore.registry.rows import (
    check_checkpoint_state,
    checkpoint_from_row,
    checkpoint_not_found,
    checkpoint_row,
)

#: Metric ``best_checkpoint`` uses when neither the call nor the experiment config names one.
DEFAULT_METRIC = "val_loss"

_C = schema.checkpoints


class CheckpointQueries:
    """The read side of the registry's checkpoints (Determined SDK names)."""

    _db: Database
    if TYPE_CHECKING:  # defined by Registry
        get_trial: Callable[[int], Trial]
        get_experiment: Callable[[int], Experiment]

    def get_checkpoint(self, uuid: str) -> Checkpoint:
        """The checkpoint with that UUID (or unique prefix of 8+ characters), in any state;
        :class:`~ckptstore.errors.CheckpointNotFound` if the registry has no such row."""

        def fn(conn: sa.Connection) -> Checkpoint:
            row = checkpoint_row(conn, _C, str(uuid))
            if row is None:
                raise checkpoint_not_found(uuid)
            return checkpoint_from_row(row)

        return self._db.read(fn, what="get a checkpoint")

    def list_checkpoints(
        self,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        states: Iterable[str] | None = None,
    ) -> list[Checkpoint]:
        """Checkpoints, oldest first by (steps_completed, created_at). ``states`` None lists
        every state; pass e.g. ``("COMMITTED",)`` to filter."""
        query = sa.select(_C)
        if trial_id is not None:
            query = query.where(_C.c.trial_id == trial_id)
        if experiment_id is not None:
            query = query.where(_C.c.experiment_id == experiment_id)
        if states is not None:
            states = tuple(states)
            for state in states:
                check_checkpoint_state(state)
            query = query.where(_C.c.state.in_(states))
        query = query.order_by(_C.c.steps_completed, _C.c.created_at, _C.c.uuid)
        return self._db.read(
            lambda conn: [checkpoint_from_row(r) for r in conn.execute(query)],
            what="list checkpoints",
        )

    def latest_checkpoint(self, trial_id: int) -> Checkpoint | None:
        """The trial's newest COMMITTED or PARTIALLY_DELETED checkpoint (most steps, then
        newest), or None when it has none (also for a trial the registry does not know)."""
        query = (
            sa.select(_C)
            .where(_C.c.trial_id == trial_id, _C.c.state.in_(LIVE_STATES))
            .order_by(_C.c.steps_completed.desc(), _C.c.created_at.desc(), _C.c.uuid.desc())
            .limit(1)
        )

        def fn(conn: sa.Connection) -> Checkpoint | None:
            row = conn.execute(query).first()
            return None if row is None else checkpoint_from_row(row)

        return self._db.read(fn, what="find the latest checkpoint")

    def _searcher_config(self, trial_id: int | None, experiment_id: int | None) -> dict[str, Any]:
        """The ``searcher`` section of the experiment config (of ``experiment_id``, else of the
        trial's experiment), or ``{}``."""
        if experiment_id is None and trial_id is not None:
            experiment_id = self.get_trial(trial_id).experiment_id
        if experiment_id is None:
            return {}
        searcher = self.get_experiment(experiment_id).config.get("searcher")
        return dict(searcher) if isinstance(searcher, dict) else {}

    def searcher_metric(
        self, *, trial_id: int | None = None, experiment_id: int | None = None
    ) -> tuple[str, bool] | None:
        """``(searcher.metric, searcher.smaller_is_better)`` recorded in the experiment config of
        ``experiment_id`` (else of the trial's experiment); None when there is none. GC's best-N
        rules rank by it when no metric is given."""
        try:
            searcher = self._searcher_config(trial_id, experiment_id)
        except (errors.TrialNotFound, errors.ExperimentNotFound):
            return None
        metric = searcher.get("metric")
        if not isinstance(metric, str) or not metric:
            return None
        return metric, bool(searcher.get("smaller_is_better", True))

    def best_checkpoint(
        self,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        metric: str | None = None,
        smaller_is_better: bool | None = None,
    ) -> Checkpoint | None:
        """The live checkpoint with the best ``metric`` (of a trial, an experiment, or all).

        ``metric`` defaults to the experiment config's ``searcher.metric``, else
        ``"val_loss"``; ``smaller_is_better`` to ``searcher.smaller_is_better`` when the metric
        is the config's, else True. A
        checkpoint's metrics may be nested (``{"validation_metrics": {"val_loss": ...}}``) or
        flat (``{"val_loss": ...}``); see :func:`~ckptstore.checkpointing.metrics.metric_value`.
        Checkpoints without the metric are skipped; ties go to the most recent. None if no
        checkpoint has the metric.
        """
        if metric is None or smaller_is_better is None:
            searcher = self._searcher_config(trial_id, experiment_id)
            configured = searcher.get("metric")
            if metric is None:
                metric = configured or DEFAULT_METRIC
            if smaller_is_better is None:
                # The config's direction belongs to the config's metric only.
                smaller_is_better = (
                    bool(searcher.get("smaller_is_better", True)) if metric == configured else True
                )
        candidates = self.list_checkpoints(
            trial_id=trial_id, experiment_id=experiment_id, states=LIVE_STATES
        )
        ranked = rank_by_metric(candidates, metric, smaller_is_better)
        return ranked[0] if ranked else None
