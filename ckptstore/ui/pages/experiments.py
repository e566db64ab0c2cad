"""``/experiments`` and ``/experiments/{id}``: the list, and one experiment's config, trials
table (sorted and filtered in SQL) and charts."""

from __future__ import annotations

from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from ckptstore.ui import charts, queries
from ckptstore.ui.context import UiContext, safe_config
from ckptstore.ui.pages.params import RUN_STATES, choice_param, float_param, int_param


def experiments_list(ui: UiContext, request: Request) -> Response:
    state = choice_param(request, "state", RUN_STATES)
    page = queries.experiments_page(ui.registry, int_param(request, "page", 1), state)
    return ui.render(request, "experiments.html", page=page, state=state, states=RUN_STATES)


def experiment_page(ui: UiContext, request: Request, experiment_id: int) -> Response:
    experiment = ui.registry.get_experiment(experiment_id)
    searcher = queries.Searcher.of(experiment.config)
    flt = queries.TrialFilter(
        state=choice_param(request, "state", RUN_STATES),
        min_metric=float_param(request, "min"),
        max_metric=float_param(request, "max"),
        sort=choice_param(request, "sort", queries.TRIAL_SORTS) or "id",
        descending=request.query_params.get("dir") == "desc",
        page=int_param(request, "page", 1),
    )
    trials = queries.experiment_trials(ui.registry, experiment_id, flt, searcher)
    stamp = queries.experiment_stamp(ui.registry, experiment_id)

    def draw() -> tuple[str | None, list[tuple[str, str]], list[Any]]:
        points = queries.experiment_points(ui.registry, experiment_id, searcher)
        if not points:
            return None, [], []
        search = searcher.name != "single"
        return (
            charts.searcher_chart(points, searcher.metric),
            charts.hparam_charts(points, searcher.metric) if search else [],
            charts.categorical_summaries(points, searcher.smaller_is_better) if search else [],
        )

    key = ("experiment-charts", experiment_id, stamp, searcher.metric, searcher.smaller_is_better)
    searcher_chart, hparam_charts, categories = ui.cached(key, draw)
    return ui.render(
        request,
        "experiment.html",
        experiment=experiment,
        config_yaml=yaml.safe_dump(
            safe_config(experiment.config), sort_keys=False, default_flow_style=False
        ),
        searcher=searcher,
        flt=flt,
        trials=trials,
        states=RUN_STATES,
        sorts=queries.TRIAL_SORTS,
        searcher_chart=searcher_chart,
        hparam_charts=hparam_charts,
        categories=categories,
    )
