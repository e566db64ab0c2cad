"""The SDK's ``Experiment`` and ``Trial`` (Determined's ``client.Experiment`` and
``client.Trial``): their rows, an experiment's trials, and their checkpoints (latest, best by the
searcher metric) and metrics. One module: each names the other (``Trial.get_experiment``,
``Experiment.list_trials``). What needs a master or a schema change raises NotSupported naming
the way.

Example::

    from ckptstore.experimental import client

    exp = client.get_experiment(1)
    best = exp.top_checkpoint()
    trial = client.get_trial(3)
    latest = trial.select_checkpoint(latest=True)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore._not_supported import not_supported, refuses
from ckptstore.experimental._checkpoint import (
    Checkpoint,
    ranked_checkpoints,
    searcher_metric,
    sort_checkpoints,
)
from ckptstore.experimental._enums import (
    _LIVE,
    _TERMINAL,
    CheckpointSortBy,
    ExperimentState,
    OrderBy,
    TrialSortBy,
    TrialState,
    _checked_enum,
    sort_rows,
)
from ckptstore.experimental._metrics import TrialMetrics, iter_metrics
from ckptstore.experimental._session import Session

if TYPE_CHECKING:
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


class Experiment:
    """An experiment in the registry (Determined's ``client.Experiment``).

    Example::

        exp = client.get_experiment(1)
        exp.wait()
        best = exp.top_checkpoint()
    """

    def __init__(self, experiment_id: int, session: Session) -> None:
        self._session = session
        self._id = int(experiment_id)
        self.reload()

    @property
    def id(self) -> int:
        return self._id

    def reload(self) -> None:
        """Read the experiment's row again."""
        row = self._session.registry().get_experiment(self._id)
        self.name = row.name
        self.config: dict[str, Any] = dict(row.config)
        self.description = row.description
        self.state = (
            ExperimentState[row.state] if row.state in ExperimentState.__members__ else row.state
        )
        self.labels: list[str] = list(self.config.get("labels") or [])
        self.notes: str | None = None
        self.archived = False
        self.progress: float | None = None
        self.project_id: int | None = None
        self.workspace_id: int | None = None

    def _trial_rows(self) -> list[Any]:
        return self._session.registry().list_trials(experiment_id=self._id)

    def list_trials(
        self, sort_by: TrialSortBy = TrialSortBy.ID, order_by: OrderBy = OrderBy.ASCENDING
    ) -> list[Trial]:
        """The experiment's trials (sorted by id, start or end time, or state)."""
        return list(self.iter_trials(sort_by, order_by))

    def get_trials(
        self, sort_by: TrialSortBy = TrialSortBy.ID, order_by: OrderBy = OrderBy.ASCENDING
    ) -> list[Trial]:
        """Determined's deprecated name for :meth:`list_trials`."""
        return self.list_trials(sort_by, order_by)

    def iter_trials(
        self,
        sort_by: TrialSortBy = TrialSortBy.ID,
        order_by: OrderBy = OrderBy.ASCENDING,
        limit: int | None = None,
    ) -> Iterator[Trial]:
        keys = {
            TrialSortBy.ID: lambda t: t.id,
            TrialSortBy.START_TIME: lambda t: t.created_at,
            TrialSortBy.END_TIME: lambda t: t.updated_at,
            TrialSortBy.STATE: lambda t: t.state,
        }
        sort_by = _checked_enum(TrialSortBy, sort_by, "sort_by")
        rows = sort_rows(self._trial_rows(), sort_by, order_by, keys)
        for row in rows[: limit if limit is not None else len(rows)]:
            yield Trial(row.id, self._session)

    def list_checkpoints(
        self,
        sort_by: CheckpointSortBy | str | None = None,
        order_by: OrderBy | None = None,
        max_results: int | None = None,
    ) -> list[Checkpoint]:
        """Live checkpoints of all trials; best first by the searcher metric by default."""
        rows = self._session.registry().list_checkpoints(experiment_id=self._id, states=_LIVE)
        return ranked_checkpoints(self._session, rows, self.config, sort_by, order_by, max_results)

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The experiment's best checkpoint (by ``sort_by``, default the searcher metric)."""
        found = self.top_n_checkpoints(1, sort_by, smaller_is_better)
        if not found:
            raise errors.CheckpointNotFound(
                f"Experiment {self._id} has no checkpoint with the metric "
                f"{sort_by or searcher_metric(self.config)[0]!r}."
            )
        return found[0]

    def top_n_checkpoints(
        self, limit: int, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> list[Checkpoint]:
        """The ``limit`` best checkpoints, best first."""
        metric, smaller = searcher_metric(self.config)
        metric = sort_by or metric
        if metric is None:
            raise errors.InvalidConfig(
                f"Experiment {self._id} has no searcher metric; pass sort_by='val_loss'."
            )
        if smaller_is_better is None:
            smaller_is_better = smaller if sort_by is None else None
        rows = self._session.registry().list_checkpoints(experiment_id=self._id, states=_LIVE)
        ranked = sort_checkpoints(rows, metric, None, None, smaller_is_better)
        return [Checkpoint(self._session, r.uuid) for r in ranked[: int(limit)]]

    def wait(self, interval: float = 5.0) -> ExperimentState | str:
        """Poll until the experiment is COMPLETED, CANCELED or ERROR; returns that state."""
        while True:
            self.reload()
            name = self.state.name if isinstance(self.state, ExperimentState) else self.state
            if name in _TERMINAL:
                return self.state
            time.sleep(interval)

    def await_first_trial(self, interval: float = 0.1) -> Trial:
        """Poll until the experiment has a trial; returns it."""
        while True:
            rows = self._trial_rows()
            if rows:
                return Trial(min(r.id for r in rows), self._session)
            time.sleep(interval)

    def set_name(self, name: str) -> None:
        self._session.registry().update_experiment(self._id, name=name)
        self.reload()

    def set_description(self, description: str) -> None:
        self._session.registry().update_experiment(self._id, description=description)
        self.reload()

    def set_labels(self, labels: list[str]) -> None:
        """Replace the labels (kept in the experiment config's ``labels``, as Determined's
        configs hold them)."""
        if isinstance(labels, str) or not all(isinstance(x, str) for x in labels):
            raise errors.InvalidConfig(f"labels must be a list of strings. Received: {labels!r}.")
        config = {**self.config, "labels": list(dict.fromkeys(labels))}
        self._session.registry().update_experiment(self._id, config=config)
        self.reload()

    def add_label(self, label: str) -> None:
        self.set_labels([*self.labels, label])

    def remove_label(self, label: str) -> None:
        self.set_labels([x for x in self.labels if x != label])

    def delete_tensorboard_files(self) -> None:
        """Delete ``<storage>/tensorboard/<trial id>/`` of every trial of the experiment."""
        from ckptstore.core._tensorboard import tensorboard_key

        storage = self._session.storage()
        for row in self._trial_rows():
            storage.delete(tensorboard_key(row.id))

    # The registry's experiments have a name, description, config (labels) and state, but no
    # archived flag or notes, and no way to delete one: these four would need a schema change.
    @refuses(
        "Experiment.archive",
        "a label: exp.add_label('archived') (and exp.remove_label('archived') to undo)",
        "the registry keeps no archived flag for experiments",
    )
    def archive(self) -> None: ...

    @refuses(
        "Experiment.unarchive",
        "a label: exp.remove_label('archived')",
        "the registry keeps no archived flag for experiments",
    )
    def unarchive(self) -> None: ...

    @refuses(
        "Experiment.set_notes",
        "exp.set_description(notes)",
        "the registry keeps no notes for experiments, only a description",
    )
    def set_notes(self, notes: str) -> None: ...

    @refuses(
        "Experiment.delete",
        "Checkpoint.delete() on each of exp.list_checkpoints() (or `ckptstore checkpoint "
        "delete`) and exp.delete_tensorboard_files() to free the storage",
        "the registry cannot delete experiments (their trials, metrics and checkpoint rows stay)",
    )
    def delete(self) -> None: ...

    download_code = not_supported(
        "Experiment.download_code",
        "the model folder you passed to `ckptstore experiment create` (ckptstore does not copy "
        "the code)",
    )
    activate = not_supported("Experiment.activate", "ckptstore experiment resume")
    pause = not_supported("Experiment.pause", "SIGTERM to the runner (trials save and stop)")
    cancel = not_supported("Experiment.cancel", "SIGTERM to the runner")
    kill = not_supported("Experiment.kill", "SIGTERM to the runner")
    move_to_project = not_supported("Experiment.move_to_project", "experiment names and labels")
    get_pachyderm_config = not_supported(
        "Experiment.get_pachyderm_config", "the config's data section"
    )

    def __repr__(self) -> str:
        return f"Experiment(id={self._id}, state={self.state})"
