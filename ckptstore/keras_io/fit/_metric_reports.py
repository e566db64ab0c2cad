"""Training metrics written to the registry off ``fit()``'s training thread (issue 42).

A registry write (an SQLite/PostgreSQL transaction) at every epoch end held ``fit()`` up for
2-40 ms (measured on 2 loaded cores; the background checkpoint writer competes for the same
cores and the GIL), as much as the whole JAX snapshot. :class:`MetricReports` writes
``"training"`` metrics on one background thread, in the order they were reported.

When errors surface: a failed write raises from the callback at its next ``on_epoch_end``
(:meth:`MetricReports.check`), at the next validation report, or at ``on_train_end``
(:meth:`MetricReports.flush`), like a failed background checkpoint save. Validation metrics stay
on the training thread, after every pending training write: their hooks (searchers, pruning)
act on them at once, and rows keep the order they were reported in.

Example::

    reports = MetricReports(core_context.train)
    reports.report("training", 10, {"loss": 0.3})  # returns at once
    reports.flush()  # waits, raises the first failed write
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Any

#: The metric group written in the background; any other is written on the calling thread.
BACKGROUND_GROUP = "training"


class MetricReports:
    """Reports metrics through ``train`` (a core ``TrainContext``); training metrics on a
    background thread (see the module docstring)."""

    def __init__(self, train: Any) -> None:
        self._train = train
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[None]] = []

    def report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Write ``metrics``: in the background for training metrics, else now (after the
        pending writes)."""
        if group != BACKGROUND_GROUP:
            self.flush()
            self._train.report_metrics(group, steps_completed, metrics)
            return
        self.check()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ckptstore-metrics"
            )
        future = self._pool.submit(self._train.report_metrics, group, steps_completed, metrics)
        self._pending.append(future)

    def check(self) -> None:
        """Raise the error of the first finished write that failed (does not wait)."""
        while self._pending and self._pending[0].done():
            self._pending.pop(0).result()

    def flush(self) -> None:
        """Wait for every pending write; raise the first error."""
        while self._pending:
            self._pending.pop(0).result()

    def close(self) -> None:
        """Wait for the pending writes (their errors are raised) and stop the thread."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
