"""``core_context.searcher``: Determined's ``SearcherContext`` / ``SearcherOperation``.

``for op in core_context.searcher.operations(): ...`` yields what the experiment's searcher asks
of this trial: train until ``op.length`` (absolute, in the unit of ``searcher.max_length`` or
``time_metric``), validate, ``op.report_completed(searcher_metric)``.

- Under ``adaptive_asha`` (started by ``ckptstore experiment``), one operation per rung, as
  Determined's master sent them before 0.38: after each rung's ``report_completed`` the searcher
  decides whether the trial goes on; a pruned trial gets no more operations, so its loop ends and
  the script exits normally. A resumed trial gets the rungs again from the first: lengths it has
  already trained past are just validated and reported.
- Any other searcher: one operation of the whole length. Outside an experiment (a script run by
  hand): one operation of length 1, like Determined's ``DummySearcherContext``.

The runner passes the searcher's shape in ``CKPTSTORE_SEARCHER`` (JSON) and names, in
``CKPTSTORE_SEARCHER_ORACLE``, the ``module:function`` that builds the pruning decision
(``ckptstore.experiment.searcher:oracle_from_env`` on Optuna); it is imported by name when the
first rung completes, so this module never imports the layers above it.

With several workers (``SearcherMode.WorkersAskChief``, the default) the chief broadcasts each
operation's length and every worker iterates in step; only the chief may report.

Scripts that never call ``operations()`` (Determined 0.38's way: ``DeterminedCallback`` or
``train.report_validation_metrics`` with a ``should_preempt()`` loop) are judged from their
validation reports instead, as 0.38's master did: the first report whose time (the metric named
by ``time_metric``; for ``max_length`` the ``batches``/``epochs``/``records`` entry, or the
reported steps for batches) reaches a rung is given to the searcher for that rung, and a pruned
trial is asked to stop through ``core_context.preempt`` (it checkpoints and exits normally).

Example::

    batches = 0
    for op in core_context.searcher.operations():
        while batches < op.length:
            train_one_batch(); batches += 1
            op.report_progress(batches)
        op.report_completed(validate()["val_loss"])
"""

from __future__ import annotations

import enum
import importlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from ckptstore import errors

logger = logging.getLogger(__name__)

#: JSON ``{"name", "metric", "unit", "rungs": [lengths]}`` set by the experiment runner.
SEARCHER_ENV = "CKPTSTORE_SEARCHER"
#: ``module:function`` returning a :data:`Oracle` (set by the runner for adaptive searches).
ORACLE_ENV = "CKPTSTORE_SEARCHER_ORACLE"

#: ``oracle(length, searcher_metric) -> True`` when the trial should stop at that rung.
Oracle = Callable[[int, float], bool]


class _Distributed(Protocol):
    rank: int
    size: int

    def broadcast(self, obj: Any) -> Any: ...


class Unit(enum.Enum):
    """The unit of ``op.length`` (``searcher.max_length``'s key)."""

    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    """``WorkersAskChief``: every worker calls ``operations()`` in step (the chief broadcasts);
    ``ChiefOnly``: only the chief calls it."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    # Determined 0.38.1 spells this value "CHEIF_ONLY"; kept so its string form matches too.
    ChiefOnly = "CHEIF_ONLY"


class SearcherOperation:
    """One train-validate-report cycle: train to :attr:`length`, then :meth:`report_completed`.

    Example::

        op.report_progress(120)
        op.report_completed(0.31)
    """

    def __init__(
        self, length: int, is_chief: bool, train: Any = None, trial_id: int | None = None
    ) -> None:
        self._length = int(length)
        self._is_chief = is_chief
        self._train = train
        self._trial_id = trial_id
        self._completed = False
        self._metric: float | None = None

    @property
    def length(self) -> int:
        """The total training (absolute, not incremental) to reach before validating."""
        return self._length

    def report_progress(self, length: float) -> None:
        """Report training progress in the unit of :attr:`length` (chief only)."""
        if not self._is_chief:
            raise errors.InvalidConfig(
                "op.report_progress() may only be called on the chief (rank 0). "
                "Received a call on another worker."
            )
        if self._completed and length != self._length:
            raise errors.InvalidConfig(
                f"op.report_progress({length}) after op.report_completed(); report progress "
                "before completing the operation."
            )
        progress = min(1.0, max(0.0, float(length) / self._length)) if self._length else 1.0
        report = getattr(self._train, "report_progress", None)
        if callable(report):
            report(progress)

    def report_completed(self, searcher_metric: Any) -> None:
        """Finish the operation with the value of ``searcher.metric`` (chief only, once)."""
        if not self._is_chief:
            raise errors.InvalidConfig(
                "op.report_completed() may only be called on the chief (rank 0). "
                "Received a call on another worker."
            )
        if self._completed:
            raise errors.InvalidConfig(
                "op.report_completed() was called twice for one operation; call it once."
            )
        try:
            value = float(searcher_metric)
        except (TypeError, ValueError):
            raise errors.InvalidConfig(
                "op.report_completed() takes the searcher metric as a number. "
                f"Received: {searcher_metric!r}."
            ) from None
        self._completed = True
        self._metric = value
        logger.info(
            "Trial %s: operation of length %d completed: %s", self._trial_id, self._length, value
        )

    def __repr__(self) -> str:
        return f"SearcherOperation(length={self._length}, completed={self._completed})"


def _load_oracle(spec: str) -> Oracle:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise errors.InvalidConfig(
            f"{ORACLE_ENV} must name an importable module:function. Received: {spec!r} ({exc})."
        ) from None
    return factory()


class SearcherContext:
    """``core_context.searcher`` (see the module docstring).

    Args:
        distributed: the trial's DistributedContext.
        lengths: the operations' lengths, in order.
        train: the TrainContext ``report_progress`` goes to.
        trial_id: for log lines.
        units: the unit of the lengths, if known.
        oracle: ``oracle(length, metric)`` -> stop; or the ``module:function`` building it.
    """

    def __init__(
        self,
        distributed: _Distributed,
        lengths: list[int],
        *,
        train: Any = None,
        trial_id: int | None = None,
        units: Unit | None = None,
        oracle: Oracle | str | None = None,
    ) -> None:
        self._dist = distributed
        self._lengths = [int(n) for n in lengths] or [1]
        self._train = train
        self._trial_id = trial_id
        self._units = units
        self._oracle = oracle
        self._unit_key: str | None = None  # the time key of validation reports
        self._metric: str | None = None
        self._judged: set[int] = set()
        self._ops_used = False

    @classmethod
    def from_env(
        cls,
        distributed: _Distributed,
        train: Any = None,
        trial_id: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SearcherContext:
        """The searcher the experiment runner described in the environment (else one
        operation of length 1)."""
        environ = os.environ if environ is None else environ
        raw = environ.get(SEARCHER_ENV, "").strip()
        shape: dict[str, Any] = {}
        if raw:
            try:
                shape = json.loads(raw)
            except json.JSONDecodeError:
                raise errors.InvalidConfig(
                    f"{SEARCHER_ENV} must hold JSON (it is set by `ckptstore experiment`). "
                    f"Received: {raw[:200]!r}."
                ) from None
        unit = shape.get("unit")
        units = (
            Unit[unit.upper()]
            if isinstance(unit, str) and unit.upper() in Unit.__members__
            else None
        )
        context = cls(
            distributed,
            list(shape.get("rungs") or []),
            train=train,
            trial_id=trial_id,
            units=units,
            oracle=environ.get(ORACLE_ENV) or None,
        )
        context._unit_key = unit if isinstance(unit, str) else None
        context._metric = shape.get("metric")
        return context

    @property
    def judges_validations(self) -> bool:
        """True when validation reports are judged at rungs (an adaptive search's trial)."""
        return self._oracle is not None and self._unit_key is not None and self._metric is not None

    def on_validation(self, steps: int, metrics: Mapping[str, Any], preempt: Any) -> None:
        """Judge a validation report at the highest rung it reached (once per rung); ask
        ``preempt`` to stop the trial when the searcher prunes it. Not used once the script
        iterates ``operations()`` (those report at the rungs themselves)."""
        if self._ops_used or not self.judges_validations:
            return
        assert self._unit_key is not None and self._metric is not None
        time_value = metrics.get(self._unit_key)
        if time_value is None and self._unit_key == "batches":
            time_value = steps
        value = metrics.get(self._metric, metrics.get(f"val_{self._metric}"))
        if not isinstance(time_value, (int, float)) or not isinstance(value, (int, float)):
            return
        reached = [r for r in self._lengths[:-1] if r <= time_value and r not in self._judged]
        if not reached:
            return
        rung = max(reached)
        self._judged.update(reached)
        if self._should_stop(rung, float(value)):
            logger.info(
                "Trial %s: the searcher stops this trial at rung %d (%s=%s); asking it to "
                "checkpoint and stop",
                self._trial_id,
                rung,
                self._unit_key,
                time_value,
            )
            preempt.request_preemption()

    def _should_stop(self, length: int, metric: float) -> bool:
        if self._oracle is None or not math.isfinite(metric):
            return False
        if isinstance(self._oracle, str):
            self._oracle = _load_oracle(self._oracle)
        return bool(self._oracle(length, metric))

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Yield the operations of this trial (see the module docstring)."""
        mode = SearcherMode(searcher_mode)
        self._ops_used = True
        synced = mode == SearcherMode.WorkersAskChief and self._dist.size > 1
        if self._dist.rank != 0:
            if mode != SearcherMode.WorkersAskChief:
                raise errors.InvalidConfig(
                    "searcher.operations(searcher_mode=ChiefOnly) was called on a worker that "
                    "is not the chief; call it on rank 0 only, or use WorkersAskChief."
                )
            while True:
                length = self._dist.broadcast(None)
                if length is None:
                    return
                yield self._new_operation(length, False)
        for i, length in enumerate(self._lengths):
            op = self._new_operation(length, True)
            if synced:
                self._dist.broadcast(length)
            yield op
            if not op._completed:
                raise errors.InvalidConfig(
                    f"The operation of length {length} ended without op.report_completed(); "
                    "report the searcher metric for every operation."
                )
            last = i == len(self._lengths) - 1
            assert op._metric is not None
            if not last and self._should_stop(length, op._metric):
                logger.info(
                    "Trial %s: the searcher stops this trial after length %d",
                    self._trial_id,
                    length,
                )
                break
        if synced:
            self._dist.broadcast(None)

    def _new_operation(self, length: int, is_chief: bool) -> SearcherOperation:
        """The operation of ``length`` handed to this worker (the chief's reports progress)."""
        if is_chief:
            return SearcherOperation(length, True, self._train, self._trial_id)
        return SearcherOperation(length, False, trial_id=self._trial_id)

    def acknowledge_out_of_ops(self) -> None:
        """Nothing to acknowledge here (kept for Determined's API)."""

    def get_configured_units(self) -> Unit | None:
        """The unit of ``searcher.max_length`` (None when unknown)."""
        return self._units

    def __repr__(self) -> str:
        return f"SearcherContext(lengths={self._lengths})"


class DummySearcherOperation(SearcherOperation):
    """Determined's ``core.DummySearcherOperation``: an operation of ``length`` that no searcher
    waits for; progress and the completed metric are only logged.

    Example::

        op = det.core.DummySearcherOperation(10, is_chief=True)
        op.report_progress(5)
        op.report_completed(0.25)
    """

    def __init__(self, length: int, is_chief: bool) -> None:
        super().__init__(length, is_chief)

    def report_progress(self, length: float) -> None:
        """Log ``length`` out of :attr:`length` (chief only, as Determined checks)."""
        super().report_progress(length)
        logger.info("progress report: %s/%s", length, self._length)


class DummySearcherContext(SearcherContext):
    """Determined's ``core.DummySearcherContext`` (its local-mode searcher): ``operations()``
    yields one :class:`DummySearcherOperation` of ``length``, with the same chief/worker
    synchronization as :class:`SearcherContext`; :meth:`get_configured_units` is EPOCHS.

    Args:
        dist: the DistributedContext (the chief broadcasts the length to the workers).
        length: the one operation's length.

    Example::

        searcher = det.core.DummySearcherContext(det.core.DummyDistributedContext(), 5)
        for op in searcher.operations():
            train_until(op.length)
            op.report_completed(validate())
    """

    def __init__(self, dist: _Distributed, length: int = 1) -> None:
        super().__init__(dist, [length], units=Unit.EPOCHS)

    def _new_operation(self, length: int, is_chief: bool) -> SearcherOperation:
        return DummySearcherOperation(length, is_chief)

    def get_configured_units(self) -> Unit | None:
        """EPOCHS, as Determined's DummySearcherContext says."""
        return Unit.EPOCHS

    def __repr__(self) -> str:
        return f"DummySearcherContext(length={self._lengths[0]})"


_NO_SEARCHER = (
    "There is no searcher: the experiment config has no searcher.max_length (Determined "
    "deprecated both it and core_context.searcher in 0.38). Set your training length in your "
    "training code and do not call core_context.searcher."
)


class SearcherContextMissing(SearcherContext):
    """Determined's ``core.SearcherContextMissing``: the ``core_context.searcher`` of a trial
    whose config has no ``searcher.max_length``. It is a SearcherContext (not an exception) whose
    every call raises :class:`~ckptstore.errors.InvalidConfig` (a ``ValueError``, as Determined
    raises) saying to set the training length in the training code.

    Example::

        searcher = det.core.SearcherContextMissing()
        searcher.operations()  # raises InvalidConfig
    """

    def __init__(self) -> None:
        super().__init__(_NoDistributed(), [])

    def operations(  # raises at the call (not when iterated), as Determined's does
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        raise errors.InvalidConfig(_NO_SEARCHER)

    def acknowledge_out_of_ops(self) -> None:
        raise errors.InvalidConfig(_NO_SEARCHER)

    def get_configured_units(self) -> Unit | None:
        raise errors.InvalidConfig(_NO_SEARCHER)

    def __repr__(self) -> str:
        return "SearcherContextMissing()"


class _NoDistributed:
    rank = 0
    size = 1

    def broadcast(self, obj: Any) -> Any:
        return obj


__all__ = [
    "ORACLE_ENV",
    "SEARCHER_ENV",
    "DummySearcherContext",
    "DummySearcherOperation",
    "Oracle",
    "SearcherContext",
    "SearcherContextMissing",
    "SearcherMode",
    "SearcherOperation",
    "Unit",
]
