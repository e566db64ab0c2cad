"""Retention policies: which committed checkpoints garbage collection keeps.

Each policy is a tiny object whose :meth:`GCPolicy.should_preserve` gets a trial's checkpoints
(oldest first) and returns one bool per checkpoint; :class:`AnyOf` keeps a checkpoint if any of
its policies does. :meth:`GCPolicy.from_determined` builds the policy Determined's
``checkpoint_storage`` keys describe, with Determined's defaults.

Example::

    from ckptstore.checkpointing.gc import AnyOf, BestN, GCPolicy, LatestN

    policy = AnyOf([LatestN(2), BestN(1, metric="val_loss", smaller_is_better=True)])
    same_as_determined_default = GCPolicy.from_determined(metric="val_loss")
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.index import CheckpointRecord

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GCContext:
    """What a policy may look at besides the trial's checkpoints."""

    #: Every committed checkpoint of the experiment (for :class:`ExperimentBestN`).
    experiment_checkpoints: Sequence[CheckpointRecord] = ()


def metric_value(record: CheckpointRecord, metric: str) -> float | None:
    """``metric`` from a checkpoint's metrics (flat, or under ``validation_metrics``), as a
    finite float; None if absent or not a number."""
    metrics = record.metrics or {}
    value = metrics.get(metric)
    if value is None and isinstance(metrics.get("validation_metrics"), dict):
        value = metrics["validation_metrics"].get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _check_n(n: Any, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise errors.InvalidConfig(f"{name} must be an int >= 0. Received: {name}={n!r}")
    return n


class GCPolicy:
    """Base class of retention policies."""

    def should_preserve(
        self, checkpoints: Sequence[CheckpointRecord], *, context: GCContext | None = None
    ) -> list[bool]:
        """One bool per checkpoint (oldest first): True keeps it."""
        raise NotImplementedError

    @staticmethod
    def from_determined(
        save_trial_latest: int = 1,
        save_trial_best: int = 1,
        save_experiment_best: int = 0,
        metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> GCPolicy:
        """Determined's retention: keep the trial's ``save_trial_latest`` newest, its
        ``save_trial_best`` best and the experiment's ``save_experiment_best`` best checkpoints
        by ``metric``. Without a metric only the newest are kept."""
        policies: list[GCPolicy] = [LatestN(_check_n(save_trial_latest, "save_trial_latest"))]
        _check_n(save_trial_best, "save_trial_best")
        _check_n(save_experiment_best, "save_experiment_best")
        if metric is None:
            if save_trial_best or save_experiment_best:
                logger.debug("No metric given: save_trial_best/save_experiment_best ignored.")
        else:
            if save_trial_best:
                policies.append(BestN(save_trial_best, metric, smaller_is_better))
            if save_experiment_best:
                policies.append(ExperimentBestN(save_experiment_best, metric, smaller_is_better))
        return AnyOf(policies)

    @staticmethod
    def from_config(config: Any) -> GCPolicy | None:
        """A policy from None, a policy, or a dict of Determined's keys."""
        if config is None or isinstance(config, GCPolicy):
            return config
        if isinstance(config, dict):
            allowed = {
                "save_trial_latest",
                "save_trial_best",
                "save_experiment_best",
                "metric",
                "smaller_is_better",
            }
            unknown = set(config) - allowed
            if unknown:
                raise errors.InvalidConfig(
                    f"Unknown GC policy keys {sorted(unknown)}; use {sorted(allowed)}."
                )
            return GCPolicy.from_determined(**config)
        raise errors.InvalidConfig(
            "gc_policy must be None, a GCPolicy or a dict of Determined's keys "
            f"(save_trial_latest, ...). Received: gc_policy={config!r}"
        )


@dataclasses.dataclass
class KeepAll(GCPolicy):
    """Keeps every checkpoint."""

    def should_preserve(self, checkpoints, *, context=None):
        return [True] * len(checkpoints)


@dataclasses.dataclass
class LatestN(GCPolicy):
    """Keeps the ``n`` newest checkpoints (by steps_completed, then creation time)."""

    n: int = 1

    def __post_init__(self) -> None:
        _check_n(self.n, "n")

    def should_preserve(self, checkpoints, *, context=None):
        keep = len(checkpoints) - self.n
        return [i >= keep for i in range(len(checkpoints))]


def _best_uuids(
    checkpoints: Sequence[CheckpointRecord], n: int, metric: str, smaller_is_better: bool
) -> set[str]:
    scored = [
        (v, i, c.uuid)
        for i, c in enumerate(checkpoints)
        if (v := metric_value(c, metric)) is not None
    ]
    # Ties go to the newer checkpoint.
    scored.sort(key=lambda t: (t[0] if smaller_is_better else -t[0], -t[1]))
    return {uuid for _v, _i, uuid in scored[:n]}


@dataclasses.dataclass
class BestN(GCPolicy):
    """Keeps the trial's ``n`` best checkpoints by ``metric``. Checkpoints without the metric
    are not "best" (set ``keep_without_metric`` to keep them anyway)."""

    n: int
    metric: str
    smaller_is_better: bool = True
    keep_without_metric: bool = False

    def __post_init__(self) -> None:
        _check_n(self.n, "n")
        if not isinstance(self.metric, str) or not self.metric:
            raise errors.InvalidConfig(f"metric must be a name. Received: metric={self.metric!r}")

    def should_preserve(self, checkpoints, *, context=None):
        best = _best_uuids(checkpoints, self.n, self.metric, self.smaller_is_better)
        return [
            c.uuid in best or (self.keep_without_metric and metric_value(c, self.metric) is None)
            for c in checkpoints
        ]


@dataclasses.dataclass
class ExperimentBestN(GCPolicy):
    """Keeps a checkpoint if it is among the ``n`` best of the whole experiment
    (``context.experiment_checkpoints``) by ``metric``."""

    n: int
    metric: str
    smaller_is_better: bool = True

    def __post_init__(self) -> None:
        _check_n(self.n, "n")
        if not isinstance(self.metric, str) or not self.metric:
            raise errors.InvalidConfig(f"metric must be a name. Received: metric={self.metric!r}")

    def should_preserve(self, checkpoints, *, context=None):
        pool = list(context.experiment_checkpoints) if context else []
        known = {c.uuid for c in pool}
        pool += [c for c in checkpoints if c.uuid not in known]
        best = _best_uuids(pool, self.n, self.metric, self.smaller_is_better)
        return [c.uuid in best for c in checkpoints]


@dataclasses.dataclass
class AnyOf(GCPolicy):
    """Keeps a checkpoint if any of ``policies`` keeps it (an empty list keeps nothing)."""

    policies: Sequence[GCPolicy]

    def should_preserve(self, checkpoints, *, context=None):
        keep = [False] * len(checkpoints)
        for policy in self.policies:
            for i, flag in enumerate(policy.should_preserve(checkpoints, context=context)):
                keep[i] = keep[i] or bool(flag)
        return keep
