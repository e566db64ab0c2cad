"""Finding the searcher metric in reported validation metrics (no TensorFlow import)."""

from __future__ import annotations

from typing import Any


def searcher_metric_value(metrics: dict[str, Any], metric: str) -> float | None:
    """``metric`` from validation metrics, accepting it with or without the ``val_`` prefix.

    Example::

        searcher_metric_value({"val_accuracy": 0.9}, "accuracy")   # 0.9
    """
    for key in (metric, f"val_{metric}", metric.removeprefix("val_")):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


__all__ = ["searcher_metric_value"]
