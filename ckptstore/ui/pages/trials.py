"""``/trials/{id}``: curves, hyperparameters, checkpoints (with what keeps each), logs and the
TensorBoard folder; ``/trials/{id}/stamp`` and ``/trials/{id}/live`` let the page of a running
trial refresh itself."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ckptstore import defaults, errors, masking
from ckptstore.registry import Trial
from ckptstore.reports.data import X_AXES, metric_series
from ckptstore.reports.views import flat_metrics
from ckptstore.ui import charts, kept, queries
from ckptstore.ui.context import UiContext, safe_config, safe_url
from ckptstore.ui.pages.params import CHECKPOINT_STATES, choice_param, int_param

#: Bytes of a trial's log shown on its page (the end of the newest log file).
LOG_TAIL_BYTES = 64 * 1024


def _options(request: Request, available: list[str]) -> charts.CurveOptions:
    chosen = [m for m in request.query_params.getlist("m") if m in available]
    raw = request.query_params.get("smooth") or "0"
    try:
        smoothing = float(raw)
    except ValueError:
        raise errors.InvalidConfig(
            f"Query parameter 'smooth' must be a number in [0, 0.99]. Received: {raw!r}"
        ) from None
    if not 0 <= smoothing <= 0.99:
        raise errors.InvalidConfig(
            f"Query parameter 'smooth' must be a number in [0, 0.99]. Received: {raw!r}"
        )
    return charts.CurveOptions(
        metrics=chosen or None,
        log_y=request.query_params.get("log") == "1",
        smoothing=smoothing,
        x=choice_param(request, "x", X_AXES) or "batches",
    )


def _checkpoint_rows(ui: UiContext, trial: Trial, config: Any, page: queries.Page) -> list[dict]:
    uuids = [row["uuid"] for row in page.rows]
    reasons = kept.kept_by(ui.registry, trial, config, uuids)
    versions = queries.versions_of(ui.registry, uuids)
    rows = []
    for row in page.rows:
        rows.append(
            {
                "uuid": row["uuid"],
                "steps_completed": row["steps_completed"],
                "epoch": (row["metadata"] or {}).get("epoch"),
                "metrics": flat_metrics(row["metrics"]),
                "size": sum(int(v) for v in (row["resources"] or {}).values()),
                "state": row["state"],
                "kept_by": reasons.get(row["uuid"], []),
                "versions": versions.get(row["uuid"], []),
            }
        )
    return rows


def _live_context(ui: UiContext, request: Request, trial: Trial) -> dict[str, Any]:
    config = None
    if trial.experiment_id is not None:
        config = ui.registry.get_experiment(trial.experiment_id).config
    x = choice_param(request, "x", X_AXES) or "batches"
    series = metric_series(ui.registry, trial.id, x=x)
    options = _options(request, list(series))
    show_all = request.query_params.get("all") == "1"
    page = queries.trial_checkpoints(
        ui.registry,
        trial.id,
        int_param(request, "page", 1),
        CHECKPOINT_STATES if show_all else queries.LIVE_STATES,
    )
    query = request.url.query
    return {
        "trial": trial,
        "live_url": f"/trials/{trial.id}/live" + (f"?{query}" if query else ""),
        "stamp": queries.trial_stamp(ui.registry, trial.id),
        "metric_names": list(series),
        "options": options,
        "curves": charts.trial_curves(series, options),
        "checkpoints": page,
        "checkpoint_rows": _checkpoint_rows(ui, trial, config, page),
        "show_all": show_all,
        "x_axes": X_AXES,
        "live": trial.status == "ACTIVE",  # only a trial whose process is alive polls
        "heartbeat_age": trial.heartbeat_age(),
    }


def _logs(ui: UiContext, trial_id: int) -> list[dict[str, Any]]:
    """The trial's log files in storage (runner-started trials), newest last, with the tail
    of each."""
    storage = ui.storage()
    key = f"{defaults.TRIAL_LOGS_PREFIX}/{trial_id}"
    files = storage.list(key)
    out = []
    for rel, size in sorted(files.items()):
        if rel.endswith("/"):
            continue
        try:
            data = storage.read_bytes(f"{key}/{rel}")
        except errors.InvalidStoragePath as exc:  # a link out of the store: said, not followed
            out.append({"name": rel, "size": size, "text": str(exc), "truncated": False})
            continue
        text = data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")
        out.append(
            {
                "name": rel,
                "size": size,
                "text": masking.mask_text(text),  # a training script may print its environment
                "truncated": len(data) > LOG_TAIL_BYTES,
            }
        )
    return out


def _tensorboard(ui: UiContext, trial_id: int) -> dict[str, Any] | None:
    storage = ui.storage()
    key = f"{defaults.TENSORBOARD_PREFIX}/{trial_id}"
    if not storage.exists(key):
        return None
    local = storage.local_path(key)
    where = local or f"{safe_url(storage.url).rstrip('/')}/{key}"
    return {"folder": where, "command": f"tensorboard --logdir {where}"}


def trial_page(ui: UiContext, request: Request, trial_id: int) -> Response:
    trial = ui.registry.get_trial(trial_id)
    ctx = _live_context(ui, request, trial)
    return ui.render(
        request,
        "trial.html",
        hparams=safe_config(trial.hparams),
        logs=_logs(ui, trial_id),
        tensorboard=_tensorboard(ui, trial_id),
        **ctx,
    )


def trial_live(ui: UiContext, request: Request, trial_id: int) -> Response:
    trial = ui.registry.get_trial(trial_id)
    return ui.render(request, "trial_live.html", **_live_context(ui, request, trial))


def trial_stamp(ui: UiContext, request: Request, trial_id: int) -> Response:
    ui.registry.get_trial(trial_id)
    return JSONResponse({"stamp": queries.trial_stamp(ui.registry, trial_id)})
