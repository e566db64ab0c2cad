"""``Checkpoint.training`` (Determined's ``CheckpointTrainingMetadata``): where a checkpoint came
from and its metrics, in the shapes Determined's SDK returns them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptstore.registry import entities


def _validation_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """A checkpoint's metrics in the shape Determined's master returns them
    (``v1Metrics.to_json()``): ``{"avgMetrics": {...}, "batchMetrics": None}``. The averages are
    the nested ``validation_metrics`` (or ``avg_metrics``) a trial reported, else the flat
    metrics the checkpoint was saved with; ckptstore keeps no per-batch validation values."""
    metrics = dict(metrics or {})
    for scope in ("validation_metrics", "avg_metrics"):
        if isinstance(metrics.get(scope), Mapping):
            return {"avgMetrics": dict(metrics[scope]), "batchMetrics": None}
    return {"avgMetrics": metrics, "batchMetrics": None}


class CheckpointTrainingMetadata:
    """``Checkpoint.training``: where a checkpoint came from and its metrics.

    ``validation_metrics`` has Determined's shape, ``{"avgMetrics": {"val_loss": ...},
    "batchMetrics": None}``.

    Example::

        ckpt = client.get_checkpoint(uuid)
        ckpt.training.validation_metrics["avgMetrics"]["val_loss"]
    """

    def __init__(self, row: entities.Checkpoint) -> None:
        self.trial_id = row.trial_id
        self.experiment_id = row.experiment_id
        self.experiment_config: dict[str, Any] = {}
        self.hparams: dict[str, Any] = {}
        self.training_metrics: dict[str, Any] = {}
        self.validation_metrics: dict[str, Any] = _validation_metrics(row.metrics)
        self.searcher_metric: float | None = None


__all__ = ["CheckpointTrainingMetadata"]
