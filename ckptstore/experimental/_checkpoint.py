"""The SDK's ``Checkpoint`` (Determined's ``client.Checkpoint``) over the registry and
storage, and the one ranking of checkpoint rows that ``Trial`` and ``Experiment`` use
(Determined's rule: a metric sorts best first, other keys ascending).

Example::

    from ckptstore.experimental import client

    ckpt = client.get_checkpoint("0b7c...")
    path = ckpt.download("/tmp/ckpt")
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore._not_supported import not_supported
from ckptstore.experimental._enums import (
    _CHECKPOINT_STATES,
    CheckpointSortBy,
    CheckpointState,
    DownloadMode,
    OrderBy,
    _checked_enum,
    _descending,
)
from ckptstore.experimental._metrics import TrialMetrics, iter_metrics
from ckptstore.experimental._session import Session, check_path
from ckptstore.experimental._training import CheckpointTrainingMetadata

if TYPE_CHECKING:
    from ckptstore.registry import entities


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


def sort_checkpoints(
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


def searcher_metric(config: Mapping[str, Any]) -> tuple[str | None, bool | None]:
    """``(metric, smaller_is_better)`` of an experiment config's searcher (None when unset)."""
    searcher = config.get("searcher") or {}
    metric = searcher.get("metric") if isinstance(searcher, Mapping) else None
    smaller = searcher.get("smaller_is_better") if isinstance(searcher, Mapping) else None
    return metric, smaller


def ranked_checkpoints(
    session: Session,
    rows: list[entities.Checkpoint],
    config: Mapping[str, Any],
    sort_by: CheckpointSortBy | str | None,
    order_by: OrderBy | None,
    max_results: int | None,
) -> list[Checkpoint]:
    """``list_checkpoints`` of a trial or experiment: by ``sort_by`` (default the searcher
    metric of ``config``), or newest first when there is neither."""
    metric, smaller = searcher_metric(config)
    if sort_by is None and metric is None:
        ordered = sorted(rows, key=lambda r: (r.steps_completed, r.created_at), reverse=True)
        if order_by is not None:
            ordered.sort(
                key=lambda r: (r.steps_completed, r.created_at),
                reverse=_descending(order_by, OrderBy.DESCENDING),
            )
    else:
        ordered = sort_checkpoints(rows, sort_by, order_by, metric, smaller)
    if max_results is not None:
        ordered = ordered[: int(max_results)]
    return [Checkpoint(session, r.uuid) for r in ordered]
