"""Render a report (see :mod:`ckptstore.reports.data`) as one self-contained HTML page.

Everything is inline: CSS in a ``<style>`` block, charts as ``<svg>``; no scripts, no links to
other files, so the page can be mailed or archived as is.

Example::

    from ckptstore.reports.html import render_report, write_report

    write_report(render_report(report), "report.html")
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from html import escape
from typing import Any

from ckptstore import __version__
from ckptstore.masking import mask_value
from ckptstore.reports.svg import PALETTE, Series, line_chart
from ckptstore.reports.views import shown_metrics

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
       margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 32px; }
h3 { font-size: 15px; margin-bottom: 6px; }
.meta { color: #666; font-size: 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.uuid { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
tr.deleted td { color: #999; text-decoration: line-through; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { border: 1px solid #ddd; background: #fff; }
.state { font-weight: bold; }
"""
_GROUP_COLORS = {"training": PALETTE[0], "validation": PALETTE[1]}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return escape(f"{value:.6g}")
    if isinstance(value, Mapping):
        return escape(", ".join(f"{k}={_plain(v)}" for k, v in value.items())) or "-"
    if isinstance(value, list | tuple):
        return escape(", ".join(_plain(v) for v in value)) or "-"
    return escape(str(value))


def _plain(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _kv_table(values: Mapping[str, Any], empty: str) -> str:
    if not values:
        return f"<p class='meta'>{escape(empty)}</p>"
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td>{_cell(v if not isinstance(v, dict | list) else json.dumps(v))}</td></tr>"
        for k, v in sorted(values.items())
    )
    return f"<table class='kv'>{rows}</table>"


def _charts(trial: Mapping[str, Any]) -> str:
    metrics = trial.get("metrics") or {}
    if not metrics:
        return "<p class='meta'>No metrics were reported for this trial.</p>"
    svgs = []
    for name, groups in metrics.items():
        series = [
            Series(group, points, _GROUP_COLORS.get(group))
            for group, points in sorted(groups.items(), key=lambda kv: (kv[0] != "training", kv[0]))
        ]
        svgs.append(
            line_chart(f"{name} (trial {trial['id']})", series, x_label="batches (steps_completed)")
        )
    return f"<div class='charts'>{''.join(svgs)}</div>"


def _checkpoint_table(checkpoints: list[Mapping[str, Any]]) -> str:
    if not checkpoints:
        return "<p class='meta'>No checkpoints.</p>"
    head = "<tr><th>UUID</th><th>Steps</th><th>State</th><th>Kept</th><th>Metrics</th><th>Model versions</th></tr>"
    rows = []
    for ckpt in checkpoints:
        css = "" if ckpt.get("kept") else " class='deleted'"
        rows.append(
            f"<tr{css}><td class='uuid'>{escape(ckpt['uuid'])}</td>"
            f"<td>{_cell(ckpt.get('steps_completed'))}</td>"
            f"<td class='state'>{_cell(ckpt.get('state'))}</td>"
            f"<td>{'kept' if ckpt.get('kept') else 'deleted'}</td>"
            f"<td>{_cell(shown_metrics(ckpt.get('metrics')))}</td>"
            f"<td>{_cell(ckpt.get('model_versions'))}</td></tr>"
        )
    return f"<table class='checkpoints'>{head}{''.join(rows)}</table>"


def _trial_section(trial: Mapping[str, Any]) -> str:
    return (
        f"<section class='trial' id='trial-{escape(str(trial['id']))}'>"
        f"<h2>Trial {escape(str(trial['id']))} "
        f"<span class='meta'>state {_cell(trial.get('state'))}, created {_cell(trial.get('created_at'))}</span></h2>"
        f"<h3>Hyperparameters</h3>{_kv_table(trial.get('hparams') or {}, 'No hyperparameters.')}"
        f"<h3>Metrics</h3>{_charts(trial)}"
        f"<h3>Checkpoints</h3>{_checkpoint_table(trial.get('checkpoints') or [])}"
        "</section>"
    )


def _summary(report: Mapping[str, Any]) -> str:
    trials = report.get("trials") or []
    if len(trials) < 2:
        return ""
    rows = []
    for trial in trials:
        latest_val: dict[str, Any] = {}
        for name, groups in (trial.get("metrics") or {}).items():
            if groups.get("validation"):
                latest_val[name] = groups["validation"][-1][1]
        rows.append(
            f"<tr><td><a href='#trial-{escape(str(trial['id']))}'>{escape(str(trial['id']))}</a></td>"
            f"<td>{_cell(trial.get('state'))}</td><td>{_cell(trial.get('hparams'))}</td>"
            f"<td>{_cell(latest_val)}</td><td>{len(trial.get('checkpoints') or [])}</td></tr>"
        )
    head = "<tr><th>Trial</th><th>State</th><th>Hyperparameters</th><th>Latest validation</th><th>Checkpoints</th></tr>"
    return f"<h2>Trials</h2><table class='summary'>{head}{''.join(rows)}</table>"


def render_report(report: Mapping[str, Any]) -> str:
    """The whole HTML page of a trial or experiment report, secrets masked
    (:mod:`ckptstore.masking`: hparams such as ``api_key``, URL passwords)."""
    report = mask_value(report)
    experiment = report.get("experiment")
    header = ""
    if experiment:
        header = (
            f"<p class='meta'>state {_cell(experiment.get('state'))}, created "
            f"{_cell(experiment.get('created_at'))}</p>"
            + (
                f"<p>{escape(experiment['description'])}</p>"
                if experiment.get("description")
                else ""
            )
        )
    body = "".join(_trial_section(t) for t in report.get("trials") or [])
    if not report.get("trials"):
        body = "<p class='meta'>No trials.</p>"
    title = escape(report.get("title", "ckptstore report"))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_CSS}</style></head><body>"
        f"<h1>{title}</h1>{header}"
        f"<p class='meta'>Generated {escape(report.get('generated_at', ''))} by ckptstore {escape(__version__)}</p>"
        f"{_summary(report)}{body}</body></html>\n"
    )


def write_report(html_text: str, path: str) -> None:
    """Write the page atomically (temp file + rename), creating the parent folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".report-", suffix=".html")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html_text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
