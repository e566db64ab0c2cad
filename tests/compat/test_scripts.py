"""Determined-shaped scripts run as a user runs them (subprocesses, the trial in environment
variables) on the S3 emulator: a DeterminedCallback training run, a second run that resumes it
with more epochs, then Determined's batch-inference recipe through the SDK client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.checkpointing._helpers import stored_folder

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_callback_script_resumes_and_the_sdk_recipe_predicts(storage_url_factory, tmp_path):
    storage = storage_url_factory("s3")
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CKPTSTORE_STORAGE": storage,
        "CKPTSTORE_REGISTRY": registry,
        "CKPTSTORE_TRIAL_ID": "3",
        "CKPTSTORE_HPARAMS": '{"epochs": 2}',
    }
    first = run("train_callback.py", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "INFO: [" in first.stderr  # logging.basicConfig(format=det.LOG_FORMAT)
    env["CKPTSTORE_HPARAMS"] = '{"epochs": 3}'
    second = run("train_callback.py", env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]

    with Registry(registry) as reg:
        training = reg.get_metrics(3, "training")
        # 6 batches per epoch, reported every 4; the second run resumed at epoch 2 (step 12)
        assert [m.steps_completed for m in training] == [4, 8, 12, 16]
        assert all({"batches", "epochs"} <= set(m.metrics) for m in training)
        assert [m.metrics["epochs"] for m in reg.get_metrics(3, "validation")] == [1, 2, 3]
        assert reg.latest_checkpoint(3).steps_completed == 18
    with open_storage(storage) as store:
        assert any(k.startswith("train/") for k in store.list("tensorboard/3"))

    out = tmp_path / "preds.npy"
    done = run("batch_inference.py", "3", str(out), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    uuid, steps = done.stdout.split()[-2:]
    assert steps == "18"
    # Determined's default folder holds it (as chunks: the manifest names the file)
    assert (tmp_path / "checkpoints" / uuid / "MANIFEST.json").is_file()
    folder = stored_folder(str(tmp_path / "checkpoints"), uuid, tmp_path / "dl")
    assert os.path.isfile(os.path.join(folder, "model.keras"))
    preds = np.load(out)
    assert preds.shape == (3, 1) and np.all(np.isfinite(preds))
