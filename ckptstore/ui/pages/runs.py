"""``/``: every run in one place: script runs (trials of no experiment, e.g. a training script
calling ``core.init``) with their state, newest metrics and last checkpoint, then the newest
experiments."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ckptstore.reports.data import COUNTERS
from ckptstore.reports.views import flat_metrics
from ckptstore.ui import queries
from ckptstore.ui.context import UiContext
from ckptstore.ui.pages.params import RUN_STATES, choice_param, int_param

#: Experiments shown under the script runs (the full list is ``/experiments``).
HOME_EXPERIMENTS = 10


def _metrics(row: dict) -> dict:
    """The newest training and validation values of a run, counters left out."""
    out = {}
    for group in ("training", "validation"):
        for name, value in flat_metrics(row.get(group)).items():
            if name not in COUNTERS:
                out[name] = value
    return out


def home(ui: UiContext, request: Request) -> Response:
    state = choice_param(request, "state", RUN_STATES)
    runs = queries.script_runs_page(ui.registry, int_param(request, "page", 1), state)
    for row in runs.rows:
        row["shown_metrics"] = _metrics(row)
    experiments = queries.experiments_page(ui.registry, 1, size=HOME_EXPERIMENTS)
    return ui.render(
        request,
        "home.html",
        runs=runs,
        experiments=experiments,
        state=state,
        states=RUN_STATES,
    )
