"""The SDK's objects -- ``Checkpoint``, ``Trial``, ``Experiment``, ``Model``, ``ModelVersion``,
``TrialMetrics`` -- over ckptstore's registry and storage, with Determined's names.

Each object reads its row from the registry when created and on ``reload()``; methods that
change something write through the registry. Calls that need a master (kill, pause, logs)
raise :class:`~ckptstore.errors.NotSupported` naming the ckptstore command to use.

Example::

    from ckptstore.experimental import client

    ckpt = client.get_checkpoint("0b7c...")
    path = ckpt.download("/tmp/ckpt")
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core._not_supported import not_supported, refuses
from ckptstore.experimental._enums import (
    _CHECKPOINT_STATES,
    _LIVE,
    _TERMINAL,
    CheckpointOrderBy,
    CheckpointSortBy,
    CheckpointState,
    DownloadMode,
    ExperimentSortBy,
    ExperimentState,
    ModelSortBy,
    OrderBy,
    TrialSortBy,
    TrialState,
    _checked_enum,
    _descending,
    sort_rows,
)
from ckptstore.experimental._session import Session, check_path
from ckptstore.experimental._training import CheckpointTrainingMetadata

if TYPE_CHECKING:
    from ckptstore.registry import entities
    from ckptstore.registry import models as registry_models

logger = logging.getLogger(__name__)


# ---- metrics ------------------------------------------------------------------------------------
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


# ---- checkpoints --------------------------------------------------------------------------------
class Checkpoint:
    """A checkpoint in the registry (Determined's ``client.Checkpoint``).

    Attributes: ``uuid``, ``state`` (a :class:`CheckpointState`), ``metadata``,
    ``resources`` (``{relpath: size}``), ``report_time``, ``training`` (trial, experiment, metrics).

    Example::

        ckpt = client.get_checkpoint(uuid)
        path = ckpt.download()          # ./checkpoints/<uuid>
        model = det.keras.load_model_from_checkpoint_path(path)
    """

    def __init__(self, session: Session, uuid: str) -> None:
        self._session = session
        self.uuid = uuid
        self.task_id: str | None = None
        self.allocation_id: str | None = None
        self.reload()

    def reload(self) -> None:
        """Read the checkpoint's row again."""
        row = self._session.registry().get_checkpoint(self.uuid)
        self.uuid = row.uuid  # a unique prefix of 8+ characters names the whole UUID
        self._row = row
        self.state = _CHECKPOINT_STATES.get(row.state, CheckpointState.ERROR)
        self.metadata: dict[str, Any] = dict(row.metadata or {})
        self.resources: dict[str, int] = dict(row.resources or {})
        self.report_time = row.created_at
        self.training = CheckpointTrainingMetadata(row)
        if row.trial_id is not None:
            try:
                trial = self._session.registry().get_trial(row.trial_id)
                self.training.hparams = dict(trial.hparams)
                if trial.experiment_id is not None:
                    exp = self._session.registry().get_experiment(trial.experiment_id)
                    self.training.experiment_config = dict(exp.config)
            except errors.CkptstoreError:
                pass

    def _storage(self, follow: bool = False) -> Any:
        return self._session.storage(self._row.storage_url or None, follow=follow)

    def download(
        self, path: str | os.PathLike[str] | None = None, mode: DownloadMode = DownloadMode.AUTO
    ) -> str:
        """Download and verify the checkpoint into ``path`` (default ``checkpoints/<uuid>``);
        returns the path. ``metadata.json`` is written there, as Determined did."""
        mode = _checked_enum(DownloadMode, mode, "mode")
        if mode is DownloadMode.MASTER:
            raise errors.NotSupported(
                "Checkpoint.download(mode=DownloadMode.MASTER) proxies through a Determined "
                "master; ckptstore reads storage directly: use mode=DownloadMode.DIRECT or AUTO."
            )
        from ckptstore.checkpointing import CheckpointContext

        target = check_path(path, self.uuid)
        os.makedirs(target, exist_ok=True)
        context = CheckpointContext(self._storage(follow=True), owns_storage=False, verify=True)
        try:
            context.download(self.uuid, target)
        finally:
            context.close()
        return target

    def write_metadata_file(self, path: str) -> None:
        """Write the checkpoint's metadata as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.metadata, f, indent=2, sort_keys=True)

    def add_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge keys into the checkpoint's metadata in the registry (the files in storage are
        not rewritten: a committed checkpoint is immutable)."""
        if not isinstance(metadata, Mapping):
            raise errors.InvalidConfig(f"metadata must be a dict. Received: {metadata!r}.")
        self._write_metadata({**self.metadata, **dict(metadata)})

    def remove_metadata(self, keys: list[str]) -> None:
        """Remove top-level keys from the checkpoint's metadata in the registry."""
        gone = {keys} if isinstance(keys, str) else set(keys)
        self._write_metadata({k: v for k, v in self.metadata.items() if k not in gone})

    def _write_metadata(self, metadata: dict[str, Any]) -> None:
        record = self._row.to_record()
        record.metadata = metadata
        self._session.registry().record_checkpoint(record)
        self.reload()

    def delete(self) -> None:
        """Delete the checkpoint's files and mark it DELETED."""
        self._context().delete(self.uuid)
        self.reload()

    def remove_files(self, globs: list[str]) -> None:
        """Delete the files matching ``globs``; the checkpoint becomes PARTIALLY_DELETED."""
        self._context().delete(self.uuid, globs=list(globs))
        self.reload()

    def _context(self) -> Any:
        from ckptstore.checkpointing import CheckpointContext

        return CheckpointContext(
            self._storage(),
            owns_storage=False,
            index=self._session.registry(),
            trial_id=self._row.trial_id,
        )

    def get_metrics(self, group: str | None = None) -> Iterator[TrialMetrics]:
        """The metrics its trial reported at the checkpoint's step."""
        if self._row.trial_id is None:
            return iter(())
        steps = self._row.steps_completed
        return (
            m
            for m in iter_metrics(self._session, [self._row.trial_id], group)
            if m.steps_completed == steps
        )

    get_pachyderm_commit = not_supported(
        "Checkpoint.get_pachyderm_commit", "your own metadata keys (Checkpoint.add_metadata)"
    )

    def __repr__(self) -> str:
        return f"Checkpoint(uuid={self.uuid!r}, state={self.state.name})"


def _sort_checkpoints(
    rows: list[entities.Checkpoint],
    sort_by: CheckpointSortBy | str | None,
    order_by: OrderBy | None,
    default_metric: str | None,
    smaller_is_better: bool | None,
) -> list[entities.Checkpoint]:
    """Determined's rule: a metric name or SEARCHER_METRIC sorts best first unless
    ``order_by`` says otherwise; other keys sort ascending by default."""
    from ckptstore.registry.entities import lookup_metric

    if isinstance(sort_by, str):
        metric: str | None = sort_by
    elif sort_by is None or sort_by is CheckpointSortBy.SEARCHER_METRIC:
        metric = default_metric
    else:
        metric = None
        _checked_enum(CheckpointSortBy, sort_by, "sort_by")
    if metric is not None:
        smaller = True if smaller_is_better is None else smaller_is_better
        scored = [r for r in rows if lookup_metric(r.metrics or {}, metric) is not None]
        scored.sort(
            key=lambda r: lookup_metric(r.metrics or {}, metric) or 0.0, reverse=not smaller
        )
        if order_by is not None and _descending(order_by, OrderBy.ASCENDING) == smaller:
            scored.reverse()
        return scored
    keys = {
        CheckpointSortBy.UUID: lambda r: r.uuid,
        CheckpointSortBy.TRIAL_ID: lambda r: r.trial_id or 0,
        CheckpointSortBy.BATCH_NUMBER: lambda r: r.steps_completed,
        CheckpointSortBy.END_TIME: lambda r: r.created_at,
        CheckpointSortBy.STATE: lambda r: r.state,
    }
    assert isinstance(sort_by, CheckpointSortBy)
    return sorted(rows, key=keys[sort_by], reverse=_descending(order_by, OrderBy.ASCENDING))


def _searcher(config: Mapping[str, Any]) -> tuple[str | None, bool | None]:
    searcher = config.get("searcher") or {}
    metric = searcher.get("metric") if isinstance(searcher, Mapping) else None
    smaller = searcher.get("smaller_is_better") if isinstance(searcher, Mapping) else None
    return metric, smaller


# ---- trials -------------------------------------------------------------------------------------
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
        return _checkpoints(
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
        metric, smaller = _searcher(self._config)
        metric = sort_by or metric
        if metric is None:
            raise errors.InvalidConfig(
                f"Trial {self.id} has no searcher metric to rank checkpoints by; pass "
                "sort_by='val_loss' (a validation metric name)."
            )
        if smaller_is_better is None:
            smaller_is_better = smaller if sort_by is None else None
        ranked = _sort_checkpoints(rows, metric, None, None, smaller_is_better)
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


def _checkpoints(
    session: Session,
    rows: list[entities.Checkpoint],
    config: Mapping[str, Any],
    sort_by: CheckpointSortBy | str | None,
    order_by: OrderBy | None,
    max_results: int | None,
) -> list[Checkpoint]:
    metric, smaller = _searcher(config)
    if sort_by is None and metric is None:
        ordered = sorted(rows, key=lambda r: (r.steps_completed, r.created_at), reverse=True)
        if order_by is not None:
            ordered.sort(
                key=lambda r: (r.steps_completed, r.created_at),
                reverse=_descending(order_by, OrderBy.DESCENDING),
            )
    else:
        ordered = _sort_checkpoints(rows, sort_by, order_by, metric, smaller)
    if max_results is not None:
        ordered = ordered[: int(max_results)]
    return [Checkpoint(session, r.uuid) for r in ordered]


# ---- experiments --------------------------------------------------------------------------------
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
        return _checkpoints(self._session, rows, self.config, sort_by, order_by, max_results)

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The experiment's best checkpoint (by ``sort_by``, default the searcher metric)."""
        found = self.top_n_checkpoints(1, sort_by, smaller_is_better)
        if not found:
            raise errors.CheckpointNotFound(
                f"Experiment {self._id} has no checkpoint with the metric "
                f"{sort_by or _searcher(self.config)[0]!r}."
            )
        return found[0]

    def top_n_checkpoints(
        self, limit: int, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> list[Checkpoint]:
        """The ``limit`` best checkpoints, best first."""
        metric, smaller = _searcher(self.config)
        metric = sort_by or metric
        if metric is None:
            raise errors.InvalidConfig(
                f"Experiment {self._id} has no searcher metric; pass sort_by='val_loss'."
            )
        if smaller_is_better is None:
            smaller_is_better = smaller if sort_by is None else None
        rows = self._session.registry().list_checkpoints(experiment_id=self._id, states=_LIVE)
        ranked = _sort_checkpoints(rows, metric, None, None, smaller_is_better)
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


# ---- models -------------------------------------------------------------------------------------
class ModelVersion:
    """One version of a registered model (Determined's ``client.ModelVersion``)."""

    def __init__(
        self, session: Session, model_version: registry_models.ModelVersion, model_name: str
    ) -> None:
        self._session = session
        self._version = model_version
        self.model_name = model_name
        self.model_version = model_version.version
        self.model_id: str = model_name
        self.checkpoint = Checkpoint(session, model_version.checkpoint_uuid)
        self.notes = model_version.notes
        self.name = model_version.aliases[0] if model_version.aliases else None
        self.comment: str | None = None
        self.metadata: dict[str, Any] = dict(self.checkpoint.metadata)

    def reload(self) -> None:
        fresh = self._session.registry().get_model(self.model_name).get_version(self.model_version)
        self.__init__(self._session, fresh, self.model_name)  # type: ignore[misc]

    def set_notes(self, notes: str) -> None:
        self._version.set_notes(notes)
        self.notes = notes

    def set_name(self, name: str) -> None:
        """Name this version: an alias, unique within the model (taken from another version)."""
        self._session.registry().get_model(self.model_name).set_alias(self.model_version, name)
        self.name = name

    def delete(self) -> None:
        self._version.delete()

    def get_metrics(self, group: str | None = None) -> Iterator[TrialMetrics]:
        return self.checkpoint.get_metrics(group)

    def iter_metrics(self, group: str | None = None) -> Iterator[TrialMetrics]:
        return self.get_metrics(group)

    def __repr__(self) -> str:
        return f"ModelVersion(model={self.model_name!r}, version={self.model_version})"


class Model:
    """A registered model (Determined's ``client.Model``).

    Example::

        model = client.create_model("mnist")
        model.register_version(checkpoint_uuid)
        latest = model.get_version()          # -1: the newest
    """

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self.name = name
        self.reload()

    def reload(self) -> None:
        self._model = self._session.registry().get_model(self.name)
        self.description = self._model.description
        self.labels: list[str] = list(self._model.labels)
        self.metadata: dict[str, Any] = dict(self._model.metadata)
        self.archived = self._model.archived
        self.creation_time = self._model.created_at
        self.last_updated_time = self._model.updated_at
        self.model_id: str = self.name
        self.username: str | None = None
        self.workspace_id: int | None = None

    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        version = self._model.register_version(checkpoint_uuid)
        return ModelVersion(self._session, version, self.name)

    def get_version(self, version: int = -1) -> ModelVersion:
        """Version ``version`` (``-1``: the newest; an alias set by ``set_name`` works too)."""
        return ModelVersion(self._session, self._model.get_version(version), self.name)

    def list_versions(self, order_by: OrderBy = OrderBy.DESCENDING) -> list[ModelVersion]:
        """All versions, newest first by default."""
        versions = [ModelVersion(self._session, v, self.name) for v in self._model.list_versions()]
        if _descending(order_by, OrderBy.DESCENDING):
            versions.reverse()
        return versions

    def get_versions(self, order_by: OrderBy = OrderBy.DESCENDING) -> list[ModelVersion]:
        """Determined's deprecated name for :meth:`list_versions`."""
        return self.list_versions(order_by)

    def set_description(self, description: str) -> None:
        self._model.set_description(description)
        self.reload()

    def set_labels(self, labels: list[str]) -> None:
        """Replace the labels."""
        self._model.remove_labels(list(self._model.labels))
        self._model.add_labels(list(labels))
        self.reload()

    def add_metadata(self, metadata: dict[str, Any]) -> None:
        self._model.add_metadata(metadata)
        self.reload()

    def remove_metadata(self, keys: list[str]) -> None:
        self._model.remove_metadata(keys)
        self.reload()

    def archive(self) -> None:
        self._model.archive()
        self.reload()

    def unarchive(self) -> None:
        self._model.unarchive()
        self.reload()

    def delete(self) -> None:
        self._model.delete()

    move_to_workspace = not_supported("Model.move_to_workspace", "model names and labels")

    def __repr__(self) -> str:
        return f"Model(name={self.name!r})"


__all__ = [
    "Checkpoint",
    "CheckpointOrderBy",
    "CheckpointSortBy",
    "CheckpointState",
    "DownloadMode",
    "Experiment",
    "ExperimentSortBy",
    "ExperimentState",
    "Model",
    "ModelSortBy",
    "ModelVersion",
    "OrderBy",
    "TrainingMetrics",
    "Trial",
    "TrialMetrics",
    "TrialSortBy",
    "TrialState",
    "ValidationMetrics",
    "iter_metrics",
    "sort_rows",
]
