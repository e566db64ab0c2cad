"""A TFKerasTrial module that turns eager execution off (issue 28.8) trains on Keras 2, in a
fresh process (``graph_mode_worker.py``; the switch is process-wide and cannot be undone): it
trains in graph mode, writes Determined's Keras 2 layout and resumes from a mid-workload
preemption to the same weights and optimizer state as a straight run. Keras 2 only (the
``TF_USE_LEGACY_KERAS=1`` child of ``test_keras2_suite.py``); Keras 3's refusal is tested in
``tests/keras_io/trial/test_controller.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.keras_io.keras_under_test import KERAS2_ONLY_MODULE

pytestmark = KERAS2_ONLY_MODULE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "keras_io", "graph_mode_worker.py")


def test_graph_mode_trial_trains_and_resumes_exactly(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, WORKER, str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'r.db'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert out["executing_eagerly"] is False
    assert out["statuses"] == ["completed", "preempted", "completed"]
    assert out["batches"] == [12, 5, 12]
    assert {"model_checkpoint.index", "model_config.json", "callback_state.json"} <= set(
        out["files"]
    )
    assert out["preempted_differs"] and out["resumed_equal"], out
    assert out["state_arrays"] > 4  # weights plus the legacy RMSprop's slots and iterations
    assert out["val_loss"][0] == pytest.approx(out["val_loss"][1], rel=1e-6)
