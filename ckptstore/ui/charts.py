"""The UI's charts: inline SVG from :mod:`ckptstore.reports.svg` (pure Python, < 1 ms per
chart), so pages stay fast and need no charting script.

Example::

    from ckptstore.ui.charts import CurveOptions, trial_curves

    svgs = trial_curves({"loss": {"training": [(1, 0.9), (2, 0.5)]}}, CurveOptions(log_y=True))
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptstore.reports.svg import PALETTE, Series, line_chart

#: A curve with more points than this is thinned evenly (its last point always kept).
MAX_POINTS = 1000
_GROUP_COLORS = {"training": "#1f77b4", "validation": "#ff7f0e"}

Points = list[tuple[float, float]]
_X_LABELS = {"batches": "batches (steps_completed)", "epochs": "epochs"}


@dataclasses.dataclass
class CurveOptions:
    """What a person chose on the trial page: metrics (None: all), log y axis, smoothing
    (0 = raw, 0.99 = very smooth; TensorBoard's debiased exponential moving average)."""

    metrics: Sequence[str] | None = None
    log_y: bool = False
    smoothing: float = 0.0
    #: The x axis: ``batches`` (steps_completed) or ``epochs`` (counters are axes, not curves).
    x: str = "batches"


def smooth(points: Points, weight: float) -> Points:
    """Debiased exponential moving average of the y values (weight in [0, 1))."""
    if weight <= 0 or not points:
        return points
    out: Points = []
    last, n = 0.0, 0
    for x, y in points:
        n += 1
        last = last * weight + (1 - weight) * y
        out.append((x, last / (1 - weight**n)))
    return out


def thin(points: Points, limit: int = MAX_POINTS) -> Points:
    """At most ``limit`` points, evenly spaced, keeping the last one (the newest value)."""
    if len(points) <= limit:
        return points
    step = len(points) / limit
    kept = [points[int(i * step)] for i in range(limit - 1)]
    return kept + [points[-1]]


def trial_curves(
    series: Mapping[str, Mapping[str, Points]], options: CurveOptions
) -> list[tuple[str, str]]:
    """``[(metric, svg)]``: one chart per chosen metric with a line per group."""
    charts = []
    for name, groups in series.items():
        if options.metrics is not None and name not in options.metrics:
            continue
        lines = [
            Series(
                group,
                thin(smooth(sorted(points), options.smoothing)),
                _GROUP_COLORS.get(group),
            )
            for group, points in sorted(groups.items(), key=lambda kv: (kv[0] != "training", kv[0]))
        ]
        title = name + (" (log scale)" if options.log_y else "")
        charts.append(
            (
                name,
                line_chart(title, lines, x_label=_X_LABELS[options.x], log_y=options.log_y),
            )
        )
    return charts


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def searcher_chart(points: Iterable[Mapping[str, Any]], metric: str) -> str:
    """Best searcher metric per trial (x: trial id), one marker each."""
    pts = [(float(p["id"]), float(p["best"])) for p in points]
    return line_chart(
        f"best {metric} per trial", [Series(metric, pts)], x_label="trial", lines=False
    )


#: Points per trial on the all-trials chart (each curve thinned evenly, the last kept).
TRIAL_CURVE_POINTS = 50


def all_trials_chart(curves: Mapping[int, Points], metric: str) -> str:
    """The searcher metric of every trial over its steps, one thin line per trial (no legend:
    each line names its trial in its tooltip)."""
    lines = [
        Series(f"trial {trial_id}", thin(points, TRIAL_CURVE_POINTS))
        for trial_id, points in sorted(curves.items())
    ]
    return line_chart(
        f"{metric} of every trial",
        lines,
        x_label="batches (steps_completed)",
        legend=len(lines) <= 8,
    )


def compare_curves(
    series_by_trial: Mapping[int, Mapping[str, Mapping[str, Points]]],
) -> list[tuple[str, str]]:
    """``[(metric, svg)]`` for chosen trials: one chart per metric any of them reported, a
    line per trial and group (``t3 validation``), each trial in its own colour."""
    names = sorted({name for series in series_by_trial.values() for name in series})
    charts = []
    for name in names:
        lines = []
        for index, (trial_id, series) in enumerate(sorted(series_by_trial.items())):
            color = PALETTE[index % len(PALETTE)]
            for group, points in sorted(series.get(name, {}).items()):
                lines.append(
                    Series(
                        f"t{trial_id} {group}",
                        thin(sorted(points)),
                        color,
                        dashed=group != "training",  # one colour per trial, validation dashed
                    )
                )
        charts.append((name, line_chart(name, lines, x_label="batches (steps_completed)")))
    return charts


def hparam_charts(points: Sequence[Mapping[str, Any]], metric: str) -> list[tuple[str, str]]:
    """``[(hparam, svg)]``: best searcher metric against every numeric hyperparameter that
    varies (log x axis is not offered: values are drawn as they are)."""
    by_name: dict[str, Points] = {}
    for p in points:
        for name, value in flat_hparams(p.get("hparams") or {}).items():
            x = _number(value)
            if x is not None:
                by_name.setdefault(name, []).append((x, float(p["best"])))
    charts = []
    for name, pts in sorted(by_name.items()):
        if len({x for x, _ in pts}) < 2:
            continue
        charts.append(
            (
                name,
                line_chart(f"{metric} vs {name}", [Series(metric, pts)], x_label=name, lines=False),
            )
        )
    return charts


def categorical_summaries(
    points: Sequence[Mapping[str, Any]], smaller_is_better: bool
) -> list[tuple[str, list[dict[str, Any]]]]:
    """``[(hparam, [{value, trials, best, median}])]`` for every non-numeric hyperparameter
    with at least two values: the searcher metric per category, best category first."""
    by_name: dict[str, dict[str, list[float]]] = {}
    for p in points:
        for name, value in flat_hparams(p.get("hparams") or {}).items():
            if _number(value) is None and value is not None:
                by_name.setdefault(name, {}).setdefault(str(value), []).append(float(p["best"]))
    out = []
    for name, groups in sorted(by_name.items()):
        if len(groups) < 2:
            continue
        rows = [
            {
                "value": value,
                "trials": len(values),
                "best": min(values) if smaller_is_better else max(values),
                "median": statistics.median(values),
            }
            for value, values in groups.items()
        ]
        rows.sort(key=lambda r: r["best"] if smaller_is_better else -r["best"])
        out.append((name, rows))
    return out


def flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested hyperparameters as ``{"optimizer.lr": 0.1}``."""
    out: dict[str, Any] = {}
    for key, value in hparams.items():
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
