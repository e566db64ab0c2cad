"""What the registry says of experiments: :func:`describe_experiment` (trials, their states,
best metric and checkpoints, the runner of each) and :func:`list_experiments`, as JSON-able
dicts for the CLI, the web UI and scripts.

Example::

    from ckptstore.experiment import describe_experiment

    info = describe_experiment(3)
    info["best_trial"], info["best_metric"], info["best_checkpoint"]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ckptstore.experiment.common import experiment_config, open_registry, registry_url
from ckptstore.experiment.config import parse_config
from ckptstore.experiment.metrics import searcher_metric_value
from ckptstore.experiment.optuna_queue import runners

if TYPE_CHECKING:
    from ckptstore.registry import Registry


def _best_metric(registry: Registry, trial_id: int, metric: str, smaller: bool) -> float | None:
    values = []
    for row in registry.get_metrics(trial_id, "validation"):
        value = searcher_metric_value(row.metrics, metric)
        if value is not None and math.isfinite(value):
            values.append(value)
    if not values:
        return None
    return min(values) if smaller else max(values)


def describe_experiment(
    experiment_id: int, *, registry: Registry | str | None = None
) -> dict[str, Any]:
    """The experiment's trials (state, hparams, batches, best metric, checkpoints, the runner
    that runs or ran each) and its best trial, metric and checkpoint by ``searcher.metric``, as
    a JSON-able dict.

    Example::

        info = describe_experiment(3)
        info["best_trial"], info["best_metric"], info["best_checkpoint"]
    """
    reg, owned = open_registry(registry)
    try:
        exp = reg.get_experiment(experiment_id)
        config = parse_config(experiment_config(reg, experiment_id))
        metric, smaller = config.searcher.metric, config.searcher.smaller_is_better
        trials = []
        ran_by = runners(registry_url(registry), experiment_id, reg)
        for t in reg.list_trials(experiment_id):
            runner, active = ran_by.get(t.id, (None, False))
            latest = reg.latest_checkpoint(t.id)
            best_ckpt = reg.best_checkpoint(trial_id=t.id, metric=metric, smaller_is_better=smaller)
            trials.append(
                {
                    "id": t.id,
                    "state": t.state,
                    "status": t.status,  # LOST: ACTIVE, but its process stopped its heartbeat
                    "hparams": t.hparams,
                    "batches_trained": latest.steps_completed if latest else 0,
                    "best_metric": _best_metric(reg, t.id, metric, smaller),
                    "latest_checkpoint": latest.uuid if latest else None,
                    "best_checkpoint": best_ckpt.uuid if best_ckpt else None,
                    # the runner (host:pid) running it now or that ran it last
                    "runner": runner,
                    "runner_active": active,
                }
            )
        scored = [t for t in trials if t["best_metric"] is not None]
        best = None
        if scored:
            best = (min if smaller else max)(scored, key=lambda t: t["best_metric"])
        best_ckpt = reg.best_checkpoint(
            experiment_id=experiment_id, metric=metric, smaller_is_better=smaller
        )
        return {
            "id": exp.id,
            "description": exp.description or "",
            "state": exp.state,
            "searcher": config.searcher.name,
            "metric": metric,
            "smaller_is_better": smaller,
            "max_trials": config.searcher.max_trials,
            "trials": trials,
            "best_trial": best["id"] if best else None,
            "best_metric": best["best_metric"] if best else None,
            "best_checkpoint": best_ckpt.uuid if best_ckpt else None,
        }
    finally:
        if owned:
            reg.close()


def list_experiments(*, registry: Registry | str | None = None) -> list[dict[str, Any]]:
    """Every experiment: id, description, state, searcher and trial count.

    Example::

        for exp in list_experiments():
            print(exp["id"], exp["state"])
    """
    reg, owned = open_registry(registry)
    try:
        out = []
        for exp in reg.list_experiments():
            cfg = dict(exp.config or {})
            out.append(
                {
                    "id": exp.id,
                    "description": exp.description or "",
                    "state": exp.state,
                    "searcher": (cfg.get("searcher") or {}).get("name"),
                    "trials": len(reg.list_trials(exp.id)),
                    "created_at": exp.created_at.isoformat() if exp.created_at else None,
                }
            )
        return out
    finally:
        if owned:
            reg.close()


__all__ = ["describe_experiment", "list_experiments"]
