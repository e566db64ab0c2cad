"""Live updates from a Ray run: a Ray task in a worker process of a local Ray cluster writes
metrics and checkpoints to a PostgreSQL registry while the UI's trial page (its stamp and live
fragment, what the page's script polls) shows each new step before the run ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from starlette.testclient import TestClient

from ckptstore.registry import Registry
from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def test_trial_page_follows_a_ray_run(postgres_url_factory, tmp_path):
    registry_url = postgres_url_factory()
    storage_url = str(tmp_path / "store")
    with Registry(registry_url) as registry:
        trial = registry.create_trial(hparams={"lr": 0.1})
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.ui.ray_writer",
            str(trial),
            registry_url,
            storage_url,
            str(STEPS),
            "2.0",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    settings = UiSettings(
        registry_url=registry_url, storage_url=storage_url, allowed_hosts=("testserver",)
    )
    seen_while_running: set[int] = set()
    stamps: set[str] = set()
    try:
        with TestClient(create_app(settings)) as client:
            deadline = time.monotonic() + 240
            while run.poll() is None:
                assert time.monotonic() < deadline, "the Ray run did not finish"
                stamp = client.get(f"/trials/{trial}/stamp").json()["stamp"]
                if stamp not in stamps:
                    stamps.add(stamp)
                    live = client.get(f"/trials/{trial}/live").text
                    rows = len(re.findall(r'class="ckpt-row"', live))
                    if run.poll() is None:
                        seen_while_running.add(rows)
                time.sleep(0.5)
            output = run.stdout.read().decode(errors="replace")
            assert run.returncode == 0, output[-3000:]
            final = client.get(f"/trials/{trial}/live").text
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    worker, driver = re.search(r"ray worker pid (\d+), driver pid (\d+)", output).groups()
    assert worker != driver  # the writes came from a Ray worker process
    # The page saw the run step by step, not only its end.
    assert len({n for n in seen_while_running if 0 < n < STEPS}) >= 2, seen_while_running
    assert len(re.findall(r'class="ckpt-row"', final)) == STEPS
    assert 'id="trial-state" class="state-COMPLETED"' in final
