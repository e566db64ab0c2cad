"""The SDK's ``Trial`` (Determined's ``client.Trial``): a trial's row, its checkpoints
(latest, best by the searcher metric) and its metrics.

Example::

    from ckptstore.experimental import client

    trial = client.get_trial(3)
    best = trial.select_checkpoint(best=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core._not_supported import not_supported
from ckptstore.experimental._checkpoint import (
    Checkpoint,
    ranked_checkpoints,
    searcher_metric,
    sort_checkpoints,
)
from ckptstore.experimental._enums import _LIVE, CheckpointSortBy, OrderBy, TrialState
from ckptstore.experimental._metrics import TrialMetrics, iter_metrics
from ckptstore.experimental._session import Session

if TYPE_CHECKING:
    from ckptstore.experimental._experiment import Experiment
    from ckptstore.registry import entities


class Trial:
    """A trial in the registry (Determined's ``client.Trial``).

    Example::

        trial = client.get_trial(3)
        best = trial.select_checkpoint(best=True)   # by the experiment's searcher metric
    """

    def __init__(self, trial_id: int, session: Session) -> None:
        self._session = session
        self.id = int(trial_id)
        self.reload()

    def reload(self) -> None:
        """Read the trial's row again."""
        row = self._session.registry().get_trial(self.id)
        self.experiment_id = row.experiment_id
        self.hparams: dict[str, Any] = dict(row.hparams)
        self.state = TrialState[row.state] if row.state in TrialState.__members__ else row.state
        self.summary_metrics: dict[str, Any] = {}
        self._config: dict[str, Any] = {}
        if row.experiment_id is not None:
            self._config = dict(self._session.registry().get_experiment(row.experiment_id).config)

    def get_experiment(self) -> Experiment:
        from ckptstore.experimental._experiment import Experiment  # it lists Trials: a cycle

        if self.experiment_id is None:
            raise errors.ExperimentNotFound(
                f"Trial {self.id} was not started by an experiment (it has no experiment id)."
            )
        return Experiment(self.experiment_id, self._session)

    def _rows(self) -> list[entities.Checkpoint]:
        return self._session.registry().list_checkpoints(trial_id=self.id, states=_LIVE)

    def list_checkpoints(
        self,
        sort_by: CheckpointSortBy | str | None = None,
        order_by: OrderBy | None = None,
        max_results: int | None = None,
    ) -> list[Checkpoint]:
        """The trial's live checkpoints; by default best first by the searcher metric (when
        the experiment has one), else newest first."""
        return ranked_checkpoints(
            self._session, self._rows(), self._config, sort_by, order_by, max_results
        )

    def get_checkpoints(
        self, sort_by: CheckpointSortBy | str | None = None, order_by: OrderBy | None = None
    ) -> list[Checkpoint]:
        """Determined's deprecated name for :meth:`list_checkpoints`."""
        return self.list_checkpoints(sort_by, order_by)

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The best checkpoint by ``sort_by`` (default: the searcher metric)."""
        return self.select_checkpoint(
            best=True, sort_by=sort_by, smaller_is_better=smaller_is_better
        )

    def select_checkpoint(
        self,
        latest: bool = False,
        best: bool = False,
        uuid: str | None = None,
        sort_by: str | None = None,
        smaller_is_better: bool | None = None,
    ) -> Checkpoint:
        """Exactly one of ``latest``, ``best`` (by ``sort_by``, default the searcher metric) or
        ``uuid``."""
        if sum([bool(latest), bool(best), uuid is not None]) != 1:
            raise errors.InvalidConfig(
                "Pass exactly one of latest=True, best=True or uuid=. Received: "
                f"latest={latest!r}, best={best!r}, uuid={uuid!r}."
            )
        if uuid is not None:
            return Checkpoint(self._session, uuid)
        rows = self._rows()
        if latest:
            if not rows:
                raise errors.CheckpointNotFound(f"Trial {self.id} has no checkpoint yet.")
            return Checkpoint(self._session, rows[-1].uuid)
        metric, smaller = searcher_metric(self._config)
        metric = sort_by or metric
        if metric is None:
            raise errors.InvalidConfig(
                f"Trial {self.id} has no searcher metric to rank checkpoints by; pass "
                "sort_by='val_loss' (a validation metric name)."
            )
        if smaller_is_better is None:
            smaller_is_better = smaller if sort_by is None else None
        ranked = sort_checkpoints(rows, metric, None, None, smaller_is_better)
        if not ranked:
            raise errors.CheckpointNotFound(
                f"Trial {self.id} has no checkpoint with the metric {metric!r}."
            )
        return Checkpoint(self._session, ranked[0].uuid)

    def iter_metrics(self, group: str) -> Iterator[TrialMetrics]:
        """Every ``group`` report of this trial, oldest first."""
        return iter_metrics(self._session, [self.id], group)

    def stream_metrics(self, group: str) -> Iterator[TrialMetrics]:
        """Determined's deprecated name for :meth:`iter_metrics`."""
        return self.iter_metrics(group)

    def stream_training_metrics(self) -> Iterator[TrialMetrics]:
        return self.iter_metrics("training")

    def stream_validation_metrics(self) -> Iterator[TrialMetrics]:
        return self.iter_metrics("validation")

    kill = not_supported("Trial.kill", "SIGTERM to the training process (it saves and stops)")
    logs = not_supported("Trial.logs", "the training process's own log (stdout/stderr)")
    iter_logs = not_supported("Trial.iter_logs", "the training process's own log")

    def __repr__(self) -> str:
        return f"Trial(id={self.id}, experiment_id={self.experiment_id})"
