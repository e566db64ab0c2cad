"""Plain dicts of registry objects, shared by tables, ``--json`` output and HTML reports.

Registry objects are read through ``getattr`` with defaults, so a missing optional field
never breaks a listing.

Example::

    from ckptstore.reports.views import checkpoint_view

    row = checkpoint_view(registry.get_checkpoint(uuid))
    print(row["uuid"], row["steps_completed"], row["state"])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptstore.registry import Registry


def flat_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"validation_metrics": {"loss": 1}}`` -> ``{"loss": 1}``; flat dicts pass through.

    Nested groups other than the two Determined names keep a ``group.`` prefix.
    """
    out: dict[str, Any] = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, Mapping):
            prefix = "" if key in ("validation_metrics", "avg_metrics") else f"{key}."
            for sub_key, sub_value in value.items():
                if not isinstance(sub_value, Mapping):
                    out.setdefault(f"{prefix}{sub_key}", sub_value)
        else:
            out[key] = value
    return out


def shown_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """:func:`flat_metrics` for a person to read: the ``evaluations`` that jobs recorded
    against a checkpoint become ``job<id>.<metric>`` (JSON output keeps the list)."""
    out = flat_metrics(metrics)
    evaluations = out.pop("evaluations", None)
    for evaluation in evaluations if isinstance(evaluations, list) else ():
        if isinstance(evaluation, Mapping) and isinstance(evaluation.get("metrics"), Mapping):
            for name, number in evaluation["metrics"].items():
                out[f"job{evaluation.get('job_id')}.{name}"] = number
    return out


def checkpoint_view(ckpt: Any) -> dict[str, Any]:
    """A registry checkpoint (or ``CheckpointRecord``) as a dict."""
    resources = dict(getattr(ckpt, "resources", None) or {})
    return {
        "uuid": ckpt.uuid,
        "trial_id": getattr(ckpt, "trial_id", None),
        "experiment_id": getattr(ckpt, "experiment_id", None),
        "steps_completed": getattr(ckpt, "steps_completed", 0),
        "state": getattr(ckpt, "state", None),
        "metrics": flat_metrics(getattr(ckpt, "metrics", None)),
        "files": len([k for k in resources if not k.endswith("/")]),
        "size_bytes": sum(resources.values()),
        "storage_url": getattr(ckpt, "storage_url", "") or None,
        "created_at": getattr(ckpt, "created_at", None),
    }


def checkpoint_detail(ckpt: Any) -> dict[str, Any]:
    """``checkpoint_view`` plus metadata, continue_id and the resource list."""
    view = checkpoint_view(ckpt)
    view["continue_id"] = getattr(ckpt, "continue_id", None)
    view["metadata"] = dict(getattr(ckpt, "metadata", None) or {})
    view["resources"] = dict(getattr(ckpt, "resources", None) or {})
    return view


def trial_view(trial: Any) -> dict[str, Any]:
    """A registry trial as a dict."""
    return {
        "id": getattr(trial, "id", None),
        "experiment_id": getattr(trial, "experiment_id", None),
        "state": getattr(trial, "state", None),
        # The state, or LOST for an ACTIVE trial whose process stopped its heartbeat.
        "status": getattr(trial, "status", getattr(trial, "state", None)),
        "hparams": dict(getattr(trial, "hparams", None) or {}),
        "created_at": getattr(trial, "created_at", None),
        "heartbeat_at": getattr(trial, "heartbeat_at", None),
    }


def experiment_view(experiment: Any) -> dict[str, Any]:
    """A registry experiment as a dict."""
    return {
        "id": getattr(experiment, "id", None),
        "name": getattr(experiment, "name", None),
        "state": getattr(experiment, "state", None),
        "description": getattr(experiment, "description", None),
        "config": getattr(experiment, "config", None) or {},
        "created_at": getattr(experiment, "created_at", None),
    }


def metric_view(row: Any) -> dict[str, Any]:
    """One reported metrics row as a dict."""
    return {
        "group": getattr(row, "group", None),
        "steps_completed": getattr(row, "steps_completed", 0),
        "metrics": flat_metrics(getattr(row, "metrics", None)),
        "reported_at": getattr(row, "reported_at", None),
    }


def model_view(model: Any) -> dict[str, Any]:
    """A registered model as a dict (without versions)."""
    return {
        "name": model.name,
        "description": getattr(model, "description", "") or "",
        "labels": list(getattr(model, "labels", None) or []),
        "metadata": dict(getattr(model, "metadata", None) or {}),
        "archived": bool(getattr(model, "archived", False)),
        "created_at": getattr(model, "created_at", None),
    }


def version_view(version: Any) -> dict[str, Any]:
    """A model version as a dict."""
    uuid = getattr(version, "checkpoint_uuid", None)
    if uuid is None and getattr(version, "checkpoint", None) is not None:
        uuid = version.checkpoint.uuid
    return {
        "model_name": getattr(version, "model_name", None),
        "version": getattr(version, "version", None),
        "checkpoint_uuid": uuid,
        "aliases": sorted(getattr(version, "aliases", None) or []),
        "notes": getattr(version, "notes", None),
        "created_at": getattr(version, "created_at", None),
    }


def model_versions_by_checkpoint(registry: Registry) -> dict[str, list[str]]:
    """``{checkpoint uuid: ["model:version", ...]}`` over every model, archived ones included."""
    found: dict[str, list[str]] = {}
    for model in registry.list_models(include_archived=True):
        for version in model.list_versions():
            view = version_view(version)
            found.setdefault(view["checkpoint_uuid"], []).append(f"{model.name}:{view['version']}")
    return found
