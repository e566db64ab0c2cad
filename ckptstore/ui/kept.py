"""Why a checkpoint is still there: which GC rule keeps it, a pin, or a model version.

The rules are the ones the experiment's trials ran with (Determined's GC keys with Determined's
defaults, judged by ``searcher.metric``; see :func:`gc_settings`), applied with the same policy
classes GC uses (:mod:`ckptstore.checkpointing.retention`). A trial that ran without a policy
(outside an experiment, or a script without GC keys) has its checkpoints listed as kept because
nothing asked to delete them.

Example::

    reasons = kept_by(registry, trial, experiment_config, ["0b7c..."])
    print(reasons["0b7c..."])  # ['latest (save_trial_latest=1)', 'model mnist:2']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.checkpointing.retention import GCContext, GCPolicy
from ckptstore.experiment.config import ran_with_gc
from ckptstore.registry import Registry, Trial
from ckptstore.ui import queries


def gc_settings(config: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The GC keys the experiment's trials ran with, Determined's defaults filled in; None
    when they ran without a policy (:func:`~ckptstore.experiment.config.ran_with_gc`: the
    config model reads the keys, as it did for the run)."""
    return ran_with_gc(dict(config)) if config else None


def kept_by(
    registry: Registry,
    trial: Trial,
    config: Mapping[str, Any] | None,
    uuids: Sequence[str],
) -> dict[str, list[str]]:
    """``{uuid: [reason, ...]}`` for the given checkpoints of ``trial`` (live ones only get
    rule reasons; pins and model versions are listed for any)."""
    reasons: dict[str, list[str]] = {u: [] for u in uuids}
    settings = gc_settings(config)
    live = queries.live_checkpoints(registry, trial.id)
    live_uuids = {row["uuid"] for row in live}
    if settings is None:
        for uuid in uuids:
            if uuid in live_uuids:
                reasons[uuid].append("no retention policy recorded")
    else:
        searcher = queries.Searcher.of(dict(config or {}))
        records = [
            CheckpointRecord(
                uuid=r["uuid"], steps_completed=r["steps_completed"], metrics=r["metrics"]
            )
            for r in live
        ]
        if trial.experiment_id is None:
            settings = {**settings, "save_experiment_best": 0}
        n_exp = settings["save_experiment_best"]
        # The experiment's n best, found by SQL (ORDER BY ... LIMIT at 100k checkpoints):
        # the pool ExperimentBestN ranks; then GC's own policy objects say what keeps what.
        top = queries.experiment_best(
            registry, trial.experiment_id or 0, searcher.metric, searcher.smaller_is_better, n_exp
        )
        context = GCContext(
            experiment_checkpoints=top,
            searcher_metric=searcher.metric,
            searcher_smaller_is_better=searcher.smaller_is_better,
        )
        policy = GCPolicy.from_determined(**settings)
        for record, labels in zip(records, policy.reasons(records, context=context), strict=True):
            if record.uuid in reasons:
                reasons[record.uuid].extend(labels)
    for uuid, holders in queries.pins_of(registry, uuids).items():
        reasons[uuid].extend(f"pinned by {h}" for h in holders)
    for uuid, versions in queries.versions_of(registry, uuids).items():
        reasons[uuid].extend(f"model {v}" for v in versions)
    return reasons
