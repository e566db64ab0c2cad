"""Retention policies: which committed checkpoints garbage collection keeps.

Each policy is a tiny object whose :meth:`GCPolicy.should_preserve` gets a trial's checkpoints
(oldest first) and returns one bool per checkpoint; :class:`AnyOf` keeps a checkpoint if any of
its policies does. :meth:`GCPolicy.from_determined` builds the policy Determined's
``checkpoint_storage`` keys describe, with Determined's defaults.

Example::

    from ckptstore.checkpointing.retention import AnyOf, BestN, GCPolicy, LatestN

    policy = AnyOf([LatestN(2), BestN(1, metric="val_loss", smaller_is_better=True)])
    same_as_determined_default = GCPolicy.from_determined(metric="val_loss")
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.checkpointing.metrics import metric_value, rank_by_metric
from ckptstore.storage_backends.config import GC_KEYS
from ckptstore.validators import int_at_least

logger = logging.getLogger(__name__)

#: Determined's retention keys with Determined's defaults (the key names are split off storage
#: dicts by :data:`ckptstore.storage_backends.config.GC_KEYS`).
DETERMINED_DEFAULTS: dict[str, int] = {
    "save_experiment_best": 0,
    "save_trial_best": 1,
    "save_trial_latest": 1,
}
#: What a best-N rule ranks by, when given with the keys (else the searcher metric).
METRIC_KEYS = ("metric", "smaller_is_better")


def check_gc_keys(keys: object, where: str) -> dict[str, Any]:
    """The one check of a dict of Determined's retention keys (plus :data:`METRIC_KEYS`), as
    ``core.init(checkpoint_gc=)``, ``CheckpointContext(gc_policy=)`` and the CLI take it:
    a copy, or :class:`~ckptstore.errors.InvalidConfig` naming ``where`` and the bad key."""
    allowed = [*GC_KEYS, *METRIC_KEYS]
    if not isinstance(keys, Mapping):
        raise errors.InvalidConfig(
            f"{where} must be a dict of Determined's GC keys {allowed}. "
            f"Received: {type(keys).__name__}."
        )
    unknown = sorted(set(keys) - set(allowed), key=str)
    if unknown:
        raise errors.InvalidConfig(f"{where} has unknown key(s) {unknown}; use {allowed}.")
    for key in GC_KEYS:
        if keys.get(key) is not None:
            int_at_least(f"{where}.{key}", keys[key], 0)
    return dict(keys)


def run_retention(keys: Mapping[str, Any], *, trial_class: bool) -> dict[str, int] | None:
    """The GC keys a run keeps its checkpoints by, Determined's defaults filled in, from the
    keys given with its storage (``StorageConfig.retention``, the one route from a YAML block,
    a ``checkpoint_storage`` dict or ``CKPTSTORE_STORAGE``). A TFKerasTrial always has a policy
    (Determined's harness applied one); a script has one only when keys were given: None
    keeps every checkpoint."""
    given = {k: v for k, v in keys.items() if k in GC_KEYS and v is not None}
    if not given and not trial_class:
        return None
    return {**DETERMINED_DEFAULTS, **given}


@dataclasses.dataclass
class GCContext:
    """What a policy may look at besides the trial's checkpoints."""

    #: Every committed checkpoint of the experiment (for :class:`ExperimentBestN`).
    experiment_checkpoints: Sequence[CheckpointRecord] = ()
    #: The searcher metric recorded for the trial's experiment (and its direction): what
    #: best-N policies built without a metric rank by, as Determined does.
    searcher_metric: str | None = None
    searcher_smaller_is_better: bool = True


def _check_n(n: Any, name: str) -> int:
    return int_at_least(name, n, 0)


class GCPolicy:
    """Base class of retention policies."""

    def should_preserve(
        self, checkpoints: Sequence[CheckpointRecord], *, context: GCContext | None = None
    ) -> list[bool]:
        """One bool per checkpoint (oldest first): True keeps it."""
        raise NotImplementedError

    def describe(self, context: GCContext | None = None) -> str:
        """What this rule keeps, in Determined's words (what the UI's "kept by" shows)."""
        return type(self).__name__

    def reasons(
        self, checkpoints: Sequence[CheckpointRecord], *, context: GCContext | None = None
    ) -> list[list[str]]:
        """Per checkpoint, the rules that keep it (empty: GC would delete it)."""
        keep = self.should_preserve(checkpoints, context=context)
        label = self.describe(context)
        return [[label] if k else [] for k in keep]

    @staticmethod
    def from_determined(
        save_trial_latest: int = 1,
        save_trial_best: int = 1,
        save_experiment_best: int = 0,
        metric: str | None = None,
        smaller_is_better: bool | None = None,
    ) -> GCPolicy:
        """Determined's retention: keep the trial's ``save_trial_latest`` newest, its
        ``save_trial_best`` best and the experiment's ``save_experiment_best`` best checkpoints
        by ``metric``. Without a metric, "best" is judged by the searcher metric recorded for
        the experiment (:class:`GCContext`); when none is known either, the best-N rules keep
        every checkpoint and say so in the log (nothing they could protect is deleted)."""
        policies: list[GCPolicy] = [LatestN(_check_n(save_trial_latest, "save_trial_latest"))]
        _check_n(save_trial_best, "save_trial_best")
        _check_n(save_experiment_best, "save_experiment_best")
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
        if isinstance(config, Mapping):
            return GCPolicy.from_determined(**check_gc_keys(config, "gc_policy"))
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

    def describe(self, context=None):
        return f"latest (save_trial_latest={self.n})"

    def should_preserve(self, checkpoints, *, context=None):
        keep = len(checkpoints) - self.n
        return [i >= keep for i in range(len(checkpoints))]


def _check_metric(metric: object) -> None:
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise errors.InvalidConfig(
            "metric must be a metric name such as 'val_loss', or None for the searcher "
            f"metric. Received: metric={metric!r}"
        )


def _ranking(
    rule: str, n: int, metric: str | None, smaller: bool | None, context: GCContext | None
) -> tuple[str, bool] | None:
    """(metric, smaller_is_better) a best-N rule ranks by, or None (logged) if none is known."""
    if metric is None and context is not None and context.searcher_metric:
        metric = context.searcher_metric
        if smaller is None:
            smaller = context.searcher_smaller_is_better
    if metric is None:
        logger.warning(
            "GC keeps every checkpoint: %s=%d but no metric is known (none given, and no "
            "searcher metric is recorded for the experiment), so any checkpoint could be the "
            "best. Pass a metric (checkpoint_gc={'metric': 'val_loss'}, or ckptstore gc "
            "--metric val_loss) to let GC delete.",
            rule,
            n,
        )
        return None
    return metric, True if smaller is None else bool(smaller)


def _metric_shown(metric: str | None, context: GCContext | None) -> str:
    return metric or (context.searcher_metric if context else None) or "the searcher metric"


def _best_uuids(
    checkpoints: Sequence[CheckpointRecord], n: int, metric: str, smaller_is_better: bool
) -> set[str]:
    return {c.uuid for c in rank_by_metric(checkpoints, metric, smaller_is_better)[:n]}


@dataclasses.dataclass
class BestN(GCPolicy):
    """Keeps the trial's ``n`` best checkpoints by ``metric`` (None: the searcher metric in the
    :class:`GCContext`; with none known, every checkpoint is kept). Checkpoints without the
    metric are not "best" (set ``keep_without_metric`` to keep them anyway)."""

    n: int
    metric: str | None = None
    smaller_is_better: bool | None = None
    keep_without_metric: bool = False

    def __post_init__(self) -> None:
        _check_n(self.n, "n")
        _check_metric(self.metric)

    def describe(self, context=None):
        return f"trial best by {_metric_shown(self.metric, context)} (save_trial_best={self.n})"

    def should_preserve(self, checkpoints, *, context=None):
        if not self.n or not checkpoints:  # nothing to rank: no warning about the metric
            return [False] * len(checkpoints)
        ranking = _ranking("save_trial_best", self.n, self.metric, self.smaller_is_better, context)
        if ranking is None:
            return [True] * len(checkpoints)
        metric, smaller = ranking
        best = _best_uuids(checkpoints, self.n, metric, smaller)
        return [
            c.uuid in best or (self.keep_without_metric and metric_value(c.metrics, metric) is None)
            for c in checkpoints
        ]


@dataclasses.dataclass
class ExperimentBestN(GCPolicy):
    """Keeps a checkpoint if it is among the ``n`` best of the whole experiment
    (``context.experiment_checkpoints``) by ``metric`` (None: the searcher metric; with none
    known, every checkpoint is kept)."""

    n: int
    metric: str | None = None
    smaller_is_better: bool | None = None

    def __post_init__(self) -> None:
        _check_n(self.n, "n")
        _check_metric(self.metric)

    def describe(self, context=None):
        return f"experiment best (save_experiment_best={self.n})"

    def should_preserve(self, checkpoints, *, context=None):
        if not self.n or not checkpoints:
            return [False] * len(checkpoints)
        ranking = _ranking(
            "save_experiment_best", self.n, self.metric, self.smaller_is_better, context
        )
        if ranking is None:
            return [True] * len(checkpoints)
        pool = list(context.experiment_checkpoints) if context else []
        known = {c.uuid for c in pool}
        pool += [c for c in checkpoints if c.uuid not in known]
        best = _best_uuids(pool, self.n, *ranking)
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

    def describe(self, context=None):
        return " or ".join(p.describe(context) for p in self.policies) or "nothing"

    def reasons(self, checkpoints, *, context=None):
        found: list[list[str]] = [[] for _ in checkpoints]
        for policy in self.policies:
            for i, labels in enumerate(policy.reasons(checkpoints, context=context)):
                found[i].extend(labels)
        return found
