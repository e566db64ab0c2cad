"""The UI in a real browser: Playwright drives the Chromium the test set-up installs
(``/usr/bin/chromium``; Playwright's own browser download is never used) against a uvicorn
server on 127.0.0.1.

- a real Keras run (another process, PostgreSQL registry) writes while the browser watches the
  trial page: new metric points and checkpoints appear without a reload;
- the experiment page sorts and filters;
- an alias set in the page is what ``ckptstore model describe`` shows;
- a checkpoint downloaded from the page verifies against its manifest.

Screenshots of the main pages are taken on the way (into ``$CKPTSTORE_UI_SCREENSHOTS`` when
set, e.g. ``docs/images`` for the docs, else into the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time

from click.testing import CliRunner
from playwright.sync_api import Page, expect

from ckptstore.checkpointing import format as ckpt_format
from ckptstore.cli.main import cli
from ckptstore.registry import Registry
from ckptstore.ui.settings import UiSettings
from tests.ui.conftest import REPO, TRIALS, LiveServer, UiEnv, screenshot, shots_folder


def _polyline_points(page: Page, series: str) -> int:
    return page.evaluate(
        """(series) => {
            const lines = document.querySelectorAll(`#curves polyline[data-series="${series}"]`);
            return lines.length ? lines[0].getAttribute("points").trim().split(/\\s+/).length : 0;
        }""",
        series,
    )


def _rows(page: Page) -> int:
    return page.locator("#checkpoints tr.ckpt-row").count()


def _wait(page: Page, condition, seconds: float, what: str) -> None:
    """Poll ``condition`` from Python (Playwright's wait_for_function would need eval, which
    the UI's Content-Security-Policy rightly forbids)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"the page never showed {what} without a reload"
        page.wait_for_timeout(250)


def test_running_trial_page_updates_without_reload(page, postgres_url_factory, tmp_path):
    registry_url = postgres_url_factory()
    storage_url = str(tmp_path / "store")
    with Registry(registry_url) as registry:
        exp = registry.create_experiment(
            "live", config={"searcher": {"name": "single", "metric": "val_loss"}}
        )
        trial = registry.create_trial(experiment_id=exp, hparams={"learning_rate": 0.01})
    env = {
        **os.environ,
        "CKPTSTORE_TRIAL_ID": str(trial),
        "CKPTSTORE_REGISTRY": registry_url,
        "CKPTSTORE_STORAGE": storage_url,
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    settings = UiSettings(registry_url=registry_url, storage_url=storage_url)
    with LiveServer(settings) as server:
        page.goto(f"{server.url}/trials/{trial}")
        expect(page.locator("#trial-state")).to_have_text("ACTIVE")
        assert page.locator("#checkpoints tr.ckpt-row").count() == 0
        page.evaluate("window.__sameDocument = 'not reloaded'")
        training = subprocess.Popen(
            [sys.executable, "-m", "tests.ui.live_train", "4", "2.5"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            # The first epoch's metrics and checkpoint arrive while the run goes on...
            _wait(page, lambda: _rows(page) >= 1, 120, "a first checkpoint row")
            first_points = _polyline_points(page, "validation")
            first_rows = _rows(page)
            assert first_points >= 1
            assert training.poll() is None, "the run ended before the page saw it running"
            # ...and later ones replace them in place, without a reload.
            _wait(page, lambda: _rows(page) > first_rows, 60, "another checkpoint row")
            _wait(
                page,
                lambda: _polyline_points(page, "validation") > first_points,
                60,
                "another validation point",
            )
            screenshot(page, shots_folder(tmp_path), "trial", full_page=True)
            output = training.communicate(timeout=180)[0].decode(errors="replace")
            assert training.returncode == 0, output[-3000:]
        finally:
            if training.poll() is None:
                training.kill()
                training.wait()
        with Registry(registry_url) as registry:
            committed = registry.list_checkpoints(trial_id=trial, states=("COMMITTED",))
            n_validation = len(registry.get_metrics(trial, "validation"))
        # The end of the run shows up too: every checkpoint and the final state.
        expect(page.locator("#checkpoints tr.ckpt-row")).to_have_count(
            len(committed), timeout=15_000
        )
        # As generous as the waits above: the page polls every 2 s, and under a loaded
        # machine's full test run 15 s once went by with ACTIVE still shown.
        expect(page.locator("#trial-state")).to_have_text("COMPLETED", timeout=60_000)
        assert _polyline_points(page, "validation") == n_validation
        assert page.evaluate("window.__sameDocument") == "not reloaded"
        for ckpt in committed:
            expect(page.locator(f'tr[data-uuid="{ckpt.uuid}"]')).to_have_count(1)


def _row_ids(page: Page) -> list[int]:
    return [
        int(x)
        for x in page.locator("#trials tr.trial-row").evaluate_all(
            "rows => rows.map(r => r.dataset.trial)"
        )
    ]


def test_experiment_page_sorts_filters_and_model_alias_and_download(page, ui_env: UiEnv, tmp_path):
    shots = shots_folder(tmp_path)
    best = {t: b for t, (_s, _lr, b) in zip(ui_env.trial_ids, TRIALS, strict=True)}
    with LiveServer(ui_env.settings()) as server:
        page.goto(f"{server.url}/experiments")
        screenshot(page, shots, "experiments")
        page.click(f"#experiments a[href='/experiments/{ui_env.experiment_id}']")

        # Sort by the best searcher metric, then reverse it, by clicking the column header.
        page.click("#trials a.sort[data-sort='best']")
        page.wait_for_url("**sort=best**")
        assert _row_ids(page) == sorted(ui_env.trial_ids, key=best.get)
        page.click("#trials a.sort[data-sort='best']")
        page.wait_for_url("**dir=desc**")
        assert _row_ids(page) == sorted(ui_env.trial_ids, key=best.get, reverse=True)
        # Filter by state and by a metric range with the form.
        page.select_option("#trial-filter select[name=state]", "COMPLETED")
        page.fill("#trial-filter input[name=max]", "0.4")
        page.click("#trial-filter button")
        page.wait_for_url("**state=COMPLETED**")
        expected = [
            t
            for t in ui_env.trial_ids
            if best[t] <= 0.4 and TRIALS[ui_env.trial_ids.index(t)][0] == "COMPLETED"
        ]
        assert _row_ids(page) == sorted(expected, key=best.get, reverse=True)
        page.goto(f"{server.url}/experiments/{ui_env.experiment_id}")
        screenshot(page, shots, "experiment")

        # Set an alias in the model page; the CLI then shows it.
        page.goto(f"{server.url}/models/mnist-cnn")
        page.fill("#set-alias input[name=alias]", "production")
        page.fill("#set-alias input[name=version]", "2")
        page.click("#set-alias button")
        expect(page.locator("tr.version-row[data-version='2'] .aliases")).to_contain_text(
            "production"
        )
        screenshot(page, shots, "model")
        result = CliRunner().invoke(
            cli,
            [
                "--registry",
                ui_env.env.registry_url,
                "--storage",
                ui_env.env.storage_url,
                "model",
                "describe",
                "mnist-cnn",
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        described = json.loads(result.stdout)
        aliases = {v["version"]: v["aliases"] for v in described["versions"]}
        assert aliases == {1: [], 2: ["production"]}

        # Verify a checkpoint in the page, then download it and check it against its manifest.
        uuid = ui_env.uuids[ui_env.trial_ids[1]][-1]
        page.goto(f"{server.url}/checkpoints/{uuid}")
        page.click("#verify")
        expect(page.locator("#verify-result")).to_contain_text("Verified")
        screenshot(page, shots, "checkpoint")
        with page.expect_download() as info:
            page.click("#download")
        archive = tmp_path / "download.tar"
        info.value.save_as(archive)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / "out", filter="data")
        folder = tmp_path / "out" / uuid
        manifest = ckpt_format.parse_manifest((folder / "MANIFEST.json").read_bytes(), uuid)
        checked = ckpt_format.verify_files(str(folder), manifest)
        assert set(checked) == {k for k in manifest["files"] if not k.endswith("/")}
        assert len(checked) >= 4
