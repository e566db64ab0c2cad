"""Metrics reporting for a trial (Determined's ``core_context.train``).

Only the chief writes to the registry; calls on other workers are accepted and ignored, as in
Determined. Metric values may be Python numbers, NumPy scalars/arrays or TensorFlow tensors;
they are converted to plain JSON (non-finite floats become ``None``, since PostgreSQL's JSON
rejects NaN) without importing TensorFlow.

Example::

    with ckptstore.core.init() as core_context:
        core_context.train.report_training_metrics(100, {"loss": 0.31})
        core_context.train.report_validation_metrics(100, {"val_loss": 0.35})
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from ckptstore import errors

logger = logging.getLogger(__name__)

TRAINING = "training"
VALIDATION = "validation"


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: tensors (anything with ``.numpy()``) and NumPy values become
    Python numbers/lists, mappings become dicts with ``str`` keys, non-finite floats ``None``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "numpy") and callable(value.numpy):  # tf.Tensor / tf.Variable
        return to_jsonable(value.numpy())
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return to_jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "__float__"):
        return to_jsonable(float(value))
    return str(value)


class TrainContext:
    """Reports a trial's training and validation metrics to the registry.

    Args:
        registry: a :class:`ckptstore.registry.Registry` (or None: metrics are only logged).
        trial_id: the trial the metrics belong to.
        distributed: the trial's distributed context; only rank 0 writes.
        experiment_id: the trial's experiment, for :meth:`get_experiment_best_validation`.

    Example::

        train = TrainContext(registry, trial_id=3, distributed=None)
        train.report_validation_metrics(200, {"val_accuracy": 0.93})
    """

    def __init__(
        self,
        registry: Any,
        trial_id: int,
        distributed: Any = None,
        *,
        experiment_id: int | None = None,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> None:
        self._registry = registry
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self._distributed = distributed
        self.searcher_metric = searcher_metric
        self.smaller_is_better = smaller_is_better

    @property
    def _is_chief(self) -> bool:
        return self._distributed is None or getattr(self._distributed, "rank", 0) == 0

    def _report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        if not isinstance(metrics, Mapping):
            raise errors.InvalidConfig(
                f"{group} metrics must be a dict of name -> value. "
                f"Received: metrics={type(metrics).__name__}."
            )
        try:
            steps = int(steps_completed)
        except (TypeError, ValueError):
            raise errors.InvalidConfig(
                f"steps_completed must be an integer. Received: steps_completed={steps_completed!r}."
            ) from None
        if steps < 0:
            raise errors.InvalidConfig(
                f"steps_completed must be >= 0. Received: steps_completed={steps}."
            )
        if not self._is_chief:
            return
        clean = to_jsonable(dict(metrics))
        logger.debug("trial %s %s metrics at step %d: %s", self.trial_id, group, steps, clean)
        if self._registry is not None:
            self._registry.report_metrics(self.trial_id, group, steps, clean)

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record training metrics after ``steps_completed`` batches (chief only)."""
        self._report(TRAINING, steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record validation metrics after ``steps_completed`` batches (chief only)."""
        self._report(VALIDATION, steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record metrics under any group name (chief only)."""
        self._report(group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        """Log training progress in [0, 1] (there is no web UI to send it to)."""
        logger.info("trial %s progress %.1f%%", self.trial_id, 100.0 * float(progress))

    def get_experiment_best_validation(self) -> float | None:
        """Best value of the searcher metric over the experiment's validations so far, or None
        (no experiment, no searcher metric, or no validation yet)."""
        if self._registry is None or self.searcher_metric is None:
            return None
        trial_ids = [self.trial_id]
        if self.experiment_id is not None:
            trial_ids = [t.id for t in self._registry.list_trials(experiment_id=self.experiment_id)]
        values: list[float] = []
        for tid in trial_ids:
            for row in self._registry.get_metrics(tid, group=VALIDATION):
                value = (row.metrics or {}).get(self.searcher_metric)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.append(float(value))
        if not values:
            return None
        return min(values) if self.smaller_is_better else max(values)

    def __repr__(self) -> str:
        return f"TrainContext(trial_id={self.trial_id})"


__all__ = ["TrainContext", "to_jsonable"]
