"""``/experiments`` and ``/experiments/{id}``: the list, and one experiment's config, trials
table (sorted and filtered in SQL) and charts."""

from __future__ import annotations

from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from ckptstore import errors
from ckptstore.reports.data import metric_series
from ckptstore.ui import charts, queries
from ckptstore.ui.context import UiContext, safe_config
from ckptstore.ui.pages.params import RUN_STATES, choice_param, float_param, int_param

#: Trials one comparison overlays (more lines than colours read as noise).
MAX_COMPARED = 8


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

    def draw() -> tuple[str | None, str | None, list[tuple[str, str]], list[Any]]:
        curves = queries.experiment_curves(ui.registry, experiment_id, searcher)
        points = queries.experiment_points(ui.registry, experiment_id, searcher, curves)
        if not points:
            return None, None, [], []
        search = searcher.name != "single"
        return (
            charts.all_trials_chart(curves, searcher.metric),
            charts.searcher_chart(points, searcher.metric),
            charts.hparam_charts(points, searcher.metric) if search else [],
            charts.categorical_summaries(points, searcher.smaller_is_better) if search else [],
        )

    key = ("experiment-charts", experiment_id, stamp, searcher.metric, searcher.smaller_is_better)
    all_trials, searcher_chart, hparam_charts, categories = ui.cached(key, draw)
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
        all_trials_chart=all_trials,
        searcher_chart=searcher_chart,
        hparam_charts=hparam_charts,
        categories=categories,
        compare=_compare(ui, request, experiment_id),
    )


def _compare(ui: UiContext, request: Request, experiment_id: int) -> dict[str, Any] | None:
    """The trials chosen with ``?compare=ID&compare=ID`` (at most :data:`MAX_COMPARED`, all of
    this experiment): their curves overlaid and their hyperparameters side by side."""
    raw = request.query_params.getlist("compare")
    if not raw:
        return None
    ids = []
    for value in raw:
        if not value.isdigit():
            raise errors.InvalidConfig(
                f"Query parameter 'compare' must be trial ids. Received: {value!r}"
            )
        ids.append(int(value))
    ids = sorted(set(ids))
    if len(ids) > MAX_COMPARED:
        raise errors.InvalidConfig(
            f"Compare at most {MAX_COMPARED} trials at once; pick fewer. Received: {len(ids)}"
        )
    trials = [ui.registry.get_trial(i) for i in ids]
    strangers = [t.id for t in trials if t.experiment_id != experiment_id]
    if strangers:
        raise errors.InvalidConfig(
            f"Only trials of experiment {experiment_id} can be compared here; open the other "
            f"trials' pages. Received: compare={strangers}"
        )
    hparams = {t.id: charts.flat_hparams(safe_config(t.hparams)) for t in trials}
    names = sorted({name for values in hparams.values() for name in values})
    return {
        "trials": trials,
        "hparam_rows": [(n, [hparams[t.id].get(n) for t in trials]) for n in names],
        "curves": charts.compare_curves({t.id: metric_series(ui.registry, t.id) for t in trials}),
    }
