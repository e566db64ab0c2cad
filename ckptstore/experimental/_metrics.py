"""Metrics reports of the SDK (Determined's ``TrialMetrics``, ``TrainingMetrics``,
``ValidationMetrics``) read from the registry's metrics rows.

Example::

    from ckptstore.experimental import client

    for report in client.get_trial(3).iter_metrics("validation"):
        print(report.steps_completed, report.metrics)
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ckptstore.experimental._session import Session

if TYPE_CHECKING:
    pass


class TrialMetrics:
    """One metrics report of a trial (Determined's ``TrialMetrics``)."""

    def __init__(
        self,
        trial_id: int,
        trial_run_id: int,
        steps_completed: int,
        end_time: _dt.datetime,
        metrics: dict[str, Any],
        group: str,
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        self.trial_id = trial_id
        self.trial_run_id = trial_run_id
        self.steps_completed = steps_completed
        self.end_time = end_time
        self.metrics = metrics
        self.group = group
        self.batch_metrics = batch_metrics

    @property
    def total_batches(self) -> int:
        """Determined's older name for ``steps_completed``."""
        return self.steps_completed

    def __repr__(self) -> str:
        return f"TrialMetrics(trial_id={self.trial_id}, group={self.group!r}, steps={self.steps_completed})"


class TrainingMetrics(TrialMetrics):
    """A ``training`` report."""


class ValidationMetrics(TrialMetrics):
    """A ``validation`` report."""


def iter_metrics(
    session: Session, trial_ids: Iterable[int], group: str | None
) -> Iterator[TrialMetrics]:
    """Reports of ``trial_ids`` in ``group`` (all groups for None), oldest first per trial."""
    kind = {"training": TrainingMetrics, "validation": ValidationMetrics}
    for trial_id in trial_ids:
        for row in session.registry().get_metrics(int(trial_id), group=group):
            cls = kind.get(row.group, TrialMetrics)
            yield cls(
                row.trial_id, 1, row.steps_completed, row.reported_at, dict(row.metrics), row.group
            )
