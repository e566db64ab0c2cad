"""The one rule for "metric X of a checkpoint" (or of a validation report), and for ranking
checkpoints by it. GC's best-N policies, ``Registry.best_checkpoint``,
``load_checkpoint_model(best_by=...)`` and the experiment searcher all use these two
functions, so they agree on which checkpoint is best.

The rule of :func:`metric_value`: the first *finite* number (not a bool, not NaN/inf) found,
trying the names ``name``, then ``val_<name>``, then ``name`` without a ``val_`` prefix (Keras
prefixes validation metrics with ``val_``, Determined's searcher config often does not), and
for each name the places ``metrics[name]`` (flat), ``metrics["validation_metrics"][name]``
(Determined's nested form), ``metrics["avg_metrics"][name]``, then any other nested dict
(in key order). A NaN value counts as absent (a diverged run is never "best").

Example::

    from ckptstore.checkpointing.metrics import metric_value, rank_by_metric

    metric_value({"validation_metrics": {"val_loss": 0.2}}, "val_loss")   # 0.2
    metric_value({"val_accuracy": 0.9}, "accuracy")                      # 0.9
    metric_value({"val_loss": float("nan")}, "val_loss")                 # None
    best_first = rank_by_metric(records, "val_loss", smaller_is_better=True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["metric_value", "rank_by_metric", "reported_value"]

_PREFERRED_SCOPES = ("validation_metrics", "avg_metrics")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _names(name: str) -> list[str]:
    names = [name, f"val_{name}", name.removeprefix("val_")]
    return list(dict.fromkeys(names))  # unique, in order


def metric_value(metrics: Mapping[str, Any] | None, name: str) -> float | None:
    """Metric ``name`` of a checkpoint's (or a report's) ``metrics`` by the rule above, as a
    finite float; None when it has none."""
    return _find(metrics, name, _number)


def reported_value(metrics: Mapping[str, Any] | None, name: str) -> float | None:
    """Like :func:`metric_value`, but a NaN/inf the run reported is returned as it is (None
    only when the metric is absent): for reporting a diverged validation to the searcher,
    which must see it, where ranking (:func:`metric_value`) must skip it."""

    def number(value: object) -> float | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)

    return _find(metrics, name, number)


def _find(metrics: Mapping[str, Any] | None, name: str, number: Any) -> float | None:
    if not isinstance(metrics, Mapping) or not isinstance(name, str):
        return None
    scopes: list[Mapping[str, Any]] = [metrics]
    scopes += [metrics[k] for k in _PREFERRED_SCOPES if isinstance(metrics.get(k), Mapping)]
    scopes += [
        v
        for k, v in sorted(metrics.items(), key=lambda kv: str(kv[0]))
        if k not in _PREFERRED_SCOPES and isinstance(v, Mapping)
    ]
    for candidate in _names(name):
        for scope in scopes:
            found = number(scope.get(candidate))
            if found is not None:
                return found
    return None


R = TypeVar("R")


def rank_by_metric(records: Sequence[R], metric: str, smaller_is_better: bool = True) -> list[R]:
    """The records (oldest first in, as the index and GC order them) that have ``metric``,
    best first; ties go to the newer record. Records without the metric are left out."""
    scored = [
        (value, i, r)
        for i, r in enumerate(records)
        if (value := metric_value(getattr(r, "metrics", None), metric)) is not None
    ]
    scored.sort(key=lambda t: (t[0] if smaller_is_better else -t[0], -t[1]))
    return [r for _v, _i, r in scored]
