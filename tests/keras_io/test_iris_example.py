"""The README's main job: examples/iris/main_job.py trains, is interrupted by SIGTERM, resumes,
and the final checkpoint is loaded by UUID and predicts (each step its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "examples", "iris", "main_job.py"),
            "--workdir",
            str(tmp_path),
            "--epochs",
            "12",
            "--step-delay",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "MAIN JOB OK" in proc.stdout
    # both runs wrote summaries; the second resumed the first's trial
    first = (tmp_path / "train-1.log").read_text().strip().splitlines()[-1]
    assert json.loads(first)["preempted"] is True
    ckpts = [p for p in (tmp_path / "checkpoints").iterdir() if (p / "MANIFEST.json").exists()]
    assert any((p / "saved_model").is_dir() for p in ckpts)  # the final one has the SavedModel


def test_train_data_ships_with_the_repo():
    sys.path.insert(0, os.path.join(REPO, "examples", "iris"))
    try:
        from train import load_data
    finally:
        sys.path.pop(0)
    x, y = load_data()
    assert x.shape == (150, 4) and sorted(set(y.tolist())) == [0, 1, 2]
