"""Finding the searcher metric in reported validation metrics (no TensorFlow import).

``searcher_metric_value`` is the one metric lookup of
:func:`ckptstore.checkpointing.metrics.metric_value` (``metric``, ``val_<metric>`` or
``metric`` without ``val_``; NaN counts as absent), so the searcher, GC and the loaders agree.

Example::

    searcher_metric_value({"val_accuracy": 0.9}, "accuracy")   # 0.9
"""

from __future__ import annotations

from ckptstore.checkpointing.metrics import metric_value as searcher_metric_value

__all__ = ["searcher_metric_value"]
