"""HTML reports rendered in headless Chromium: what the page shows, not just its source."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ckptstore.reports.svg import Series, line_chart, nice_ticks

pytestmark = pytest.mark.e2e  # renders pages in headless Chromium


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install -y chromium)")


def _chromium_args(tmp_path) -> list[str]:
    return [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]


def render_dom(tmp_path, html_path) -> str:
    result = subprocess.run(
        [*_chromium_args(tmp_path), "--dump-dom", f"file://{html_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _experiment(env):
    registry = env.registry()
    exp = registry.create_experiment("digits", config={"searcher": {"name": "random"}})
    trials = [
        registry.create_trial(experiment_id=exp, hparams={"lr": lr, "units": 8})
        for lr in (0.1, 0.01)
    ]
    uuids = {}
    for trial in trials:
        for step in (10, 20, 30):
            registry.report_metrics(
                trial, "training", step, {"loss": 1.0 / step, "accuracy": step / 40}
            )
            registry.report_metrics(
                trial, "validation", step, {"val_loss": 1.5 / step, "val_accuracy": step / 50}
            )
        uuids[trial] = [
            env.save(trial, step, experiment_id=exp, metrics={"val_loss": 1.5 / step})
            for step in (10, 20, 30)
        ]
    registry.close()
    return exp, trials, uuids


def test_experiment_report_in_chromium(env, tmp_path):
    exp, trials, uuids = _experiment(env)
    deleted = uuids[trials[0]][0]
    assert env.run("checkpoint", "delete", deleted, "-y").exit_code == 0
    env.run("model", "create", "digits-model")
    env.run("model", "register-version", "digits-model", uuids[trials[1]][2])

    out = tmp_path / "report.html"
    result = env.run("experiment", "report", str(exp), "-o", str(out))
    assert result.exit_code == 0, result.output
    source = out.read_text()
    assert "<script" not in source and "http://" not in source.replace(
        "http://www.w3.org/2000/svg", ""
    )

    dom = render_dom(tmp_path, out)
    assert "Experiment 1: digits" in dom
    for trial in trials:
        assert f"Trial {trial}" in dom
        for uuid in uuids[trial]:
            assert uuid in dom
    for metric in ("loss (trial", "accuracy (trial"):
        assert metric in dom
    assert dom.count("<svg") >= 4 and dom.count("<polyline") >= 8
    assert 'data-series="training"' in dom and 'data-series="validation"' in dom
    assert "lr" in dom and "0.01" in dom
    assert "deleted" in dom and "DELETED" in dom
    assert "digits-model:1" in dom

    shot = tmp_path / "report.png"
    subprocess.run(
        [
            *_chromium_args(tmp_path),
            "--window-size=1200,1600",
            f"--screenshot={shot}",
            f"file://{out}",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000  # a real picture, not a blank page
    if os.environ.get("CKPTSTORE_KEEP_REPORT"):
        shutil.copy(shot, os.environ["CKPTSTORE_KEEP_REPORT"])


def test_trial_report_and_not_found(env, tmp_path):
    exp, trials, uuids = _experiment(env)
    registry = env.registry()
    registry.add_checkpoint_evaluation(
        uuids[trials[1]][0], {"job_id": 7, "metrics": {"accuracy": 0.875}, "evaluated_at": "x"}
    )
    registry.close()
    out = tmp_path / "trial.html"
    assert env.run("trial", "report", str(trials[1]), "-o", str(out)).exit_code == 0
    dom = render_dom(tmp_path, out)
    assert f"Trial {trials[1]}" in dom and all(u in dom for u in uuids[trials[1]])
    # A job's evaluation of a checkpoint shows as a metric of it, not as raw JSON.
    assert "job7.accuracy" in dom and "0.875" in dom and "evaluated_at" not in dom
    assert not any(u in dom for u in uuids[trials[0]])
    assert env.run("trial", "report", "999", "-o", str(out)).exit_code == 3
    assert env.run("experiment", "report", "999", "-o", str(out)).exit_code == 3


def test_line_chart_edge_cases():
    empty = line_chart("loss", [Series("training", [])])
    assert "no data" in empty and "<polyline" not in empty
    single = line_chart(
        "loss", [Series("training", [(5, 1.0)]), Series("validation", [(5, float("nan"))])]
    )
    assert single.count("<polyline") == 1 and "validation (no data)" in single
    escaped = line_chart("<b>&", [Series("a<b", [(1, 1), (2, 2)])])
    assert "<b>&" not in escaped and "&lt;b&gt;&amp;" in escaped
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
