"""Gather what a report shows from the registry into plain dicts (no HTML here).

Example::

    from ckptstore.registry import Registry
    from ckptstore.reports.data import collect_experiment_report

    report = collect_experiment_report(Registry("sqlite:///reg.db"), 1)
    print([t["id"] for t in report["trials"]])
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING, Any

from ckptstore.checkpointing.index import STATES
from ckptstore.reports.views import (
    checkpoint_view,
    experiment_view,
    flat_metrics,
    model_versions_by_checkpoint,
    trial_view,
)

if TYPE_CHECKING:
    from ckptstore.registry import Registry

ALL_STATES = STATES


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


#: Values every report carries that count progress (Determined's ``batches``/``epochs``, the
#: step): they are x axes, not metrics, so no chart draws them as curves.
COUNTERS = ("batches", "epochs", "steps_completed")
#: The x axes a trial's curves can be drawn against (``batches`` is ``steps_completed``).
X_AXES = ("batches", "epochs")


def metric_series(
    registry: Registry, trial_id: int, x: str = "batches"
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{metric: {group: [(x, value), ...]}}`` for a trial, counters left out; validation
    names lose any ``val_`` prefix so training and validation curves of one metric share a
    chart. ``x="epochs"`` plots against each report's ``epochs`` value (reports without one
    are left out of that view)."""
    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for row in registry.get_metrics(trial_id):
        group = getattr(row, "group", "training")
        values = flat_metrics(getattr(row, "metrics", None))
        at = (
            _number(values.get("epochs"))
            if x == "epochs"
            else float(getattr(row, "steps_completed", 0))
        )
        if at is None:
            continue
        for name, value in values.items():
            number = _number(value)
            if number is None or name in COUNTERS:
                continue
            base = name[4:] if group == "validation" and name.startswith("val_") else name
            series.setdefault(base, {}).setdefault(group, []).append((at, number))
    return dict(sorted(series.items()))


def trial_section(registry: Registry, trial: Any, versions: dict[str, list[str]]) -> dict[str, Any]:
    """One trial's part of a report: fields, hyperparameters, curves, checkpoints."""
    view = trial_view(trial)
    checkpoints = []
    for ckpt in registry.list_checkpoints(trial_id=view["id"], states=ALL_STATES):
        row = checkpoint_view(ckpt)
        row["model_versions"] = versions.get(row["uuid"], [])
        row["kept"] = row["state"] in ("COMMITTED", "PARTIALLY_DELETED")
        checkpoints.append(row)
    view["metrics"] = metric_series(registry, view["id"])
    view["checkpoints"] = checkpoints
    return view


def collect_trial_report(registry: Registry, trial_id: int) -> dict[str, Any]:
    """The report of one trial (TrialNotFound if unknown)."""
    trial = registry.get_trial(trial_id)
    versions = model_versions_by_checkpoint(registry)
    return {
        "kind": "trial",
        "title": f"Trial {trial_id}",
        "experiment": None,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "trials": [trial_section(registry, trial, versions)],
    }


def collect_experiment_report(registry: Registry, experiment_id: int) -> dict[str, Any]:
    """The report of an experiment and all its trials (ExperimentNotFound if unknown)."""
    experiment = experiment_view(registry.get_experiment(experiment_id))
    versions = model_versions_by_checkpoint(registry)
    trials = sorted(registry.list_trials(experiment_id=experiment_id), key=lambda t: t.id)
    name = f": {experiment['name']}" if experiment.get("name") else ""
    return {
        "kind": "experiment",
        "title": f"Experiment {experiment_id}{name}",
        "experiment": experiment,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "trials": [trial_section(registry, t, versions) for t in trials],
    }
