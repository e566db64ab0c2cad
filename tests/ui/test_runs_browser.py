"""Issue 31 in a real browser (Playwright on the apt Chromium, uvicorn on 127.0.0.1), over one
registry per module: the small search of ``conftest.TRIALS`` plus script runs that real
processes trained (``tests/ui/script_run.py``, NumPy, no experiment):

- ``/`` lists every script run with what happened to it: one that finished is COMPLETED, one
  that got SIGTERM is PAUSED, one that crashed is ERROR, one SIGKILLed (its heartbeat then
  aged, by rewriting the timestamp instead of waiting 150 s) is LOST; the CLI says the same;
  only a live trial's page polls; resuming the PAUSED run makes it COMPLETED, and its new
  checkpoint's page links the checkpoint it resumed from and shows the bytes it shares;
- counters are x axes, not curves;
- the experiment page overlays every trial's searcher metric and compares chosen trials;
- the model page lists versions with their source and the history of alias moves.

Screenshots: ``ui-*.png`` into ``$CKPTSTORE_UI_SCREENSHOTS`` (``docs/images`` for the docs).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from playwright.sync_api import Page, expect

from ckptstore.cli.main import cli
from ckptstore.registry import Registry, schema
from ckptstore.registry.entities import LOST_AFTER_SECONDS
from tests.ui.conftest import REPO, LiveServer, UiEnv, build_ui_env, screenshot, shots_folder
from tests.ui.script_run import VOCABULARY

#: Script-run trial ids (no experiment; the search's trials are 1-5).
DONE, PREEMPTED, CRASHED, KILLED = 101, 102, 103, 104


def _start(env: dict[str, str], mode: str, trial: int, epochs: int = 3) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ui.script_run", mode, str(trial), str(epochs)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_for_checkpoint(registry_url: str, trial: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    with Registry(registry_url) as registry:
        while not registry.list_checkpoints(trial_id=trial, states=("COMMITTED",)):
            assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"trial {trial} wrote no checkpoint in 120 s"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[tuple[UiEnv, dict[str, str]]]:
    """The search, then four script runs trained at once by real processes."""
    ui_env = build_ui_env(tmp_path_factory.mktemp("ui-runs"))
    env = {
        **os.environ,
        "CKPTSTORE_REGISTRY": ui_env.env.registry_url,
        "CKPTSTORE_STORAGE": ui_env.env.storage_url,
        "PYTHONPATH": str(REPO),
    }
    procs = {
        DONE: _start(env, "complete", DONE),
        CRASHED: _start(env, "crash", CRASHED),
        PREEMPTED: _start(env, "until-preempted", PREEMPTED),
        KILLED: _start(env, "until-preempted", KILLED),
    }
    try:
        for trial, sig in ((PREEMPTED, signal.SIGTERM), (KILLED, signal.SIGKILL)):
            _wait_for_checkpoint(ui_env.env.registry_url, trial, procs[trial])
            procs[trial].send_signal(sig)
        codes = {t: p.wait(timeout=120) for t, p in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert codes == {DONE: 0, CRASHED: 1, PREEMPTED: 0, KILLED: -signal.SIGKILL}
    # The SIGKILLed process said nothing; time passes (its heartbeat ages past the limit).
    old = schema.utcnow() - dt.timedelta(seconds=LOST_AFTER_SECONDS + 60)
    with Registry(ui_env.env.registry_url) as registry:
        registry._db.write(
            lambda c: c.execute(
                schema.trials.update().where(schema.trials.c.id == KILLED).values(heartbeat_at=old)
            ),
            what="age a heartbeat",
        )
    yield ui_env, env


def _states(page: Page) -> dict[int, str]:
    rows = page.locator("#runs tr.run-row")
    return {
        int(rows.nth(i).get_attribute("data-trial")): rows.nth(i).locator("td.state").inner_text()
        for i in range(rows.count())
    }


def test_script_runs_show_what_happened_and_resume(page, runs, tmp_path):
    ui_env, env = runs
    with LiveServer(ui_env.settings()) as server:
        page.goto(server.url + "/")
        expected = {DONE: "COMPLETED", PREEMPTED: "PAUSED", CRASHED: "ERROR", KILLED: "LOST"}
        assert _states(page) == expected
        done = page.locator(f"#runs tr[data-trial='{DONE}']")
        expect(done).to_contain_text("val_loss=")  # newest metrics; counters are not metrics
        assert "batches=" not in done.inner_text()
        with Registry(ui_env.env.registry_url) as registry:
            last = registry.latest_checkpoint(DONE)
        expect(done.locator(f"a[href='/checkpoints/{last.uuid}']")).to_have_count(1)
        expect(page.locator("#experiments tr")).to_have_count(2)  # header + the search
        screenshot(page, shots_folder(tmp_path), "home", full_page=True)

        # The CLI and its JSON say the same.
        result = CliRunner().invoke(
            cli,
            ["--registry", ui_env.env.registry_url, "--storage", ui_env.env.storage_url]
            + ["trial", "list", "--json"],
        )
        assert result.exit_code == 0, result.output
        listed = {t["id"]: t["status"] for t in json.loads(result.stdout)}
        assert {t: listed[t] for t in expected} == expected

        # Only a live trial's page polls: a LOST one says its process is gone.
        page.goto(f"{server.url}/trials/{KILLED}")
        expect(page.locator("#trial-state")).to_have_text("LOST")
        expect(page.locator("#lost")).to_contain_text("no heartbeat for")
        assert page.locator("#live").get_attribute("data-active") == "0"

        # Run the PAUSED script again: it resumes, is ACTIVE while it runs, then COMPLETED.
        with Registry(ui_env.env.registry_url) as registry:
            paused_at = registry.latest_checkpoint(PREEMPTED)
        resumed = _start(env, "complete", PREEMPTED, epochs=paused_at.steps_completed // 4 + 2)
        output = resumed.communicate(timeout=120)[0].decode(errors="replace")
        assert resumed.returncode == 0, output[-3000:]
        page.goto(server.url + "/")
        assert _states(page)[PREEMPTED] == "COMPLETED"
        with Registry(ui_env.env.registry_url) as registry:
            after = registry.list_checkpoints(trial_id=PREEMPTED, states=("COMMITTED",))
        first_new = next(c for c in after if c.steps_completed > paused_at.steps_completed)
        page.goto(f"{server.url}/checkpoints/{first_new.uuid}")
        expect(page.locator("#resumed-from a")).to_have_text(paused_at.uuid)
        expect(page.locator("#previous a")).to_have_text(paused_at.uuid)
        # Deduplicated checkpoints (the default on a local store too): the unchanged
        # vocabulary is shared (stored once), the weights are not.
        shared = page.locator("#shared")
        assert int(shared.get_attribute("data-shared")) == len(VOCABULARY)
        expect(shared).to_contain_text("deduplicated: stored once")
        expect(page.locator("tr[data-file='weights.npy'] td").nth(2)).to_have_text("0 B")
        expect(page.locator("#signature")).to_contain_text("UNSIGNED")
        screenshot(page, shots_folder(tmp_path), "checkpoint", full_page=True)


def test_counters_are_axes_not_curves(page, runs, tmp_path):
    ui_env, _ = runs
    with LiveServer(ui_env.settings()) as server:
        page.goto(f"{server.url}/trials/{DONE}")
        expect(page.locator("#trial-state")).to_have_text("COMPLETED")
        assert page.locator("#live").get_attribute("data-active") == "0"
        metrics = page.locator("#curves .curve").evaluate_all(
            "els => els.map(e => e.dataset.metric)"
        )
        assert metrics == ["loss"]  # val_loss joins it; batches/epochs are not curves
        expect(page.locator("#curves svg")).to_contain_text("batches (steps_completed)")
        page.select_option("#curve-options select[name=x]", "epochs")
        page.click("#curve-options button")
        page.wait_for_url("**x=epochs**")
        expect(page.locator("#curves svg")).to_contain_text("epochs")
        expect(page.locator("#curves svg")).not_to_contain_text("steps_completed")
        screenshot(page, shots_folder(tmp_path), "trial", full_page=True)


def test_experiment_overlays_and_compares_trials(page, runs, tmp_path):
    ui_env, _ = runs
    first, second = ui_env.trial_ids[0], ui_env.trial_ids[1]
    with LiveServer(ui_env.settings()) as server:
        page.goto(f"{server.url}/experiments/{ui_env.experiment_id}")
        every = page.locator("#searcher-charts svg").first.locator("polyline")
        expect(every).to_have_count(len(ui_env.trial_ids))
        page.check(f"input[name=compare][value='{first}']")
        page.check(f"input[name=compare][value='{second}']")
        page.click("#compare-button")
        page.wait_for_url("**compare=**")
        header = page.locator("#compare-hparams tr").first
        expect(header).to_have_text(f"trial {first}trial {second}")
        expect(page.locator("#compare-hparams tr[data-hparam='learning_rate']")).to_have_text(
            "learning_rate0.10.01"
        )
        lines = page.locator("#compare-curves .curve[data-metric='loss'] polyline")
        names = lines.evaluate_all("ls => ls.map(l => l.dataset.series)")
        assert names == [
            f"t{first} training",
            f"t{first} validation",
            f"t{second} training",
            f"t{second} validation",
        ]
        screenshot(page, shots_folder(tmp_path), "compare", full_page=True)
        bad = page.goto(f"{server.url}/experiments/{ui_env.experiment_id}?compare={DONE}")
        assert bad is not None and bad.status == 400  # a trial of no experiment: said, not shown


def test_model_page_versions_and_alias_history(page, runs, tmp_path):
    ui_env, _ = runs
    with LiveServer(ui_env.settings()) as server:
        page.goto(f"{server.url}/models/mnist-cnn")
        row = page.locator("tr.version-row[data-version='1']")
        expect(row.locator(".source a").first).to_have_text(f"trial {ui_env.trial_ids[1]}")
        expect(row.locator(".metrics")).to_contain_text("val_loss=")
        for version in ("1", "2"):
            page.fill("#set-alias input[name=alias]", "prod")
            page.fill("#set-alias input[name=version]", version)
            page.click("#set-alias button")
            expect(
                page.locator(f"tr.version-row[data-version='{version}'] .aliases")
            ).to_contain_text("prod")
        moves = page.locator("#alias-history tr.alias-move")
        expect(moves).to_have_count(2)
        newest = moves.first.locator("td")
        assert [newest.nth(i).inner_text() for i in range(1, 5)] == [
            "prod",
            "2",
            "1",
            "ckptstore ui (127.0.0.1)",
        ]
        screenshot(page, shots_folder(tmp_path), "model", full_page=True)
