"""Exact resume across processes: 4 epochs straight == 2 epochs, SIGKILL, 2 more epochs.

Each run is a fresh Python process (tests/keras_io/resume_worker.py) on local storage and
a SQLite registry, with deterministic data order and a Dropout layer (so RNG state matters).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.checkpointing._helpers import stored_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_worker(workdir, *args: str, expect_rc: int = 0) -> dict | None:
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.keras_io.resume_worker", "--dir", str(workdir), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == expect_rc, proc.stdout[-3000:] + proc.stderr[-5000:]
    tag = args[args.index("--tag") + 1] if "--tag" in args else "result"
    path = os.path.join(workdir, f"{tag}.json")
    if expect_rc != 0:
        return None
    with open(path) as f:
        return json.load(f)


def load_arrays(workdir, tag: str = "result") -> dict[str, np.ndarray]:
    with np.load(os.path.join(workdir, f"{tag}.npz")) as z:
        return {k: z[k] for k in z.files}


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    assert any(k.startswith("optimizer/") for k in a)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.slow
def test_four_epochs_equal_two_plus_sigkill_plus_two(tmp_path):
    straight = tmp_path / "straight"
    resumed = tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()

    ref = run_worker(straight, "--epochs", "4")
    run_worker(resumed, "--epochs", "4", "--kill-after-epoch", "2", expect_rc=-signal.SIGKILL)
    got = run_worker(resumed, "--epochs", "4")

    assert got["resumed"] is True
    assert got["epochs_run"] == 2  # epochs 3 and 4 only
    assert ref["epochs_run"] == 4
    assert got["history_epochs"] == 4  # Keras's History carried over the kill
    assert_same_state(load_arrays(straight), load_arrays(resumed))
    for key in ("steps_completed", "iterations", "learning_rate"):
        assert got[key] == ref[key], key
    # every stateful callback carried its state over the kill
    for key in ("early_stopping", "plateau", "counter"):
        assert got[key] == ref[key], key
    assert got["counter"]["epochs"] == 4
    assert ref["learning_rate"] < 0.01 or ref["plateau"]["wait"] >= 0


@pytest.mark.slow
def test_clean_stop_then_resume_and_warm_start(tmp_path):
    straight = tmp_path / "straight"
    straight.mkdir()
    ref = run_worker(straight, "--epochs", "3")

    run_worker(tmp_path, "--epochs", "1", "--tag", "first")
    got = run_worker(tmp_path, "--epochs", "3", "--tag", "second")
    assert got["resumed"] and got["epochs_run"] == 2
    assert got["steps_completed"] == ref["steps_completed"] == 12
    assert_same_state(load_arrays(straight), load_arrays(tmp_path, "second"))

    # warm start: another continue_id takes only the weights: epoch 0, fresh optimizer
    warm = run_worker(
        tmp_path,
        "--epochs",
        "1",
        "--continue-id",
        "99",
        "--checkpoint",
        got["last_checkpoint"],
        "--tag",
        "warm",
    )
    assert warm["resumed"] is False
    assert warm["epochs_run"] == 1
    assert warm["iterations"] == 4  # one epoch of 4 steps from a fresh optimizer
    assert warm["counter"]["epochs"] == 1  # callback state not restored


@pytest.mark.slow
def test_sigterm_preemption_saves_stops_and_resumes(tmp_path):
    # SIGTERM after step 6 (second epoch, 4 steps per epoch); DeterminedCallback checks
    # before the signalling callback, so it sees the request after step 7
    first = run_worker(tmp_path, "--epochs", "4", "--sigterm-at-step", "6", "--tag", "first")
    assert first["preempted"] is True
    assert first["epochs_run"] == 2  # the interrupted epoch ends early
    assert first["steps_completed"] == 7
    ckpt_dir = Path(
        stored_folder(str(tmp_path / "ckpts"), first["last_checkpoint"], tmp_path / "dl")
    )
    with open(ckpt_dir / "callback_state.json") as f:
        state = json.load(f)
    assert state["epoch"] == 1 and state["epoch_complete"] is False
    assert state["data"]["batch"] == 3  # saved at the batch boundary: 3 batches of epoch 2 done
    # saved before the interrupted epoch's end reached any callback: one epoch counted
    assert (ckpt_dir / "epoch_counter.txt").read_text() == "1"
    with open(ckpt_dir / "metadata.json") as f:
        meta = json.load(f)
    assert meta["continue_id"] == 1 and meta["steps_completed"] == 7

    second = run_worker(tmp_path, "--epochs", "4", "--tag", "second")
    assert second["resumed"] is True
    # the rest of epoch 2 (from its 4th batch), then 3 and 4: no batch trained twice
    assert second["epochs_run"] == 3
    assert second["steps_completed"] == 16
    assert second["counter"]["epochs"] == 4
    assert second["preempted"] is False
