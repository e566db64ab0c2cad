"""Keras 3 backends (issue 42): checkpoints move between TensorFlow, JAX and PyTorch; the others
are refused.

The cross-backend test runs in the main run (this process on TensorFlow, the other backend JAX)
and again in the JAX and PyTorch children of ``tests/keras_io/test_jax_suite.py`` and
``test_torch_suite.py`` (this process on JAX or PyTorch, the other TensorFlow): a checkpoint written on one backend is loaded, resumed (optimizer state
included) and checkpointed on the other, and that checkpoint comes back to the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.keras_io import backend
from tests._helpers.jax_env import REPO, keras_env, require_backend
from tests.keras_io import backend_worker

HERE = keras.backend.backend()
OTHER = "tensorflow" if HERE in ("jax", "torch") else "jax"


def _run_worker(backend_name: str, workdir, epochs: int) -> dict:
    out = os.path.join(workdir, f"{backend_name}-{epochs}.json")
    env = keras_env(backend_name, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.keras_io.backend_worker", "--dir", str(workdir),
         "--epochs", str(epochs), "--out", out],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.skipif(
    HERE not in ("tensorflow", "jax", "torch"), reason="TensorFlow <-> JAX or PyTorch"
)
def test_checkpoints_resume_and_load_across_backends(tmp_path):
    require_backend("jax" if HERE == "tensorflow" else HERE)
    # 1 epoch here
    backend_worker.main(["--dir", str(tmp_path), "--epochs", "1", "--out", str(tmp_path / "a")])
    with open(tmp_path / "a") as f:
        mine = json.load(f)
    assert mine["backend"] == HERE and not mine["resumed"]
    # the other backend resumes it (optimizer state as saved), trains epoch 2, checkpoints
    theirs = _run_worker(OTHER, tmp_path, epochs=2)
    assert theirs["backend"] == OTHER and theirs["resumed"]
    assert theirs["iterations_at_start"] == backend_worker.STEPS
    # Adam's moments, bit-equal (in order: a second model in one process has other paths)
    assert list(theirs["slots_at_start"].values()) == list(mine["slots_now"].values())
    np.testing.assert_allclose(theirs["predictions"], theirs["fit_predictions"], rtol=1e-6)
    # ... and its checkpoint comes back here: same predictions, and training goes on from it
    model = det.load_checkpoint_model(
        checkpoint_uuid=theirs["last_checkpoint"],
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'registry.db'}",
    )
    x, _ = backend_worker.data()
    np.testing.assert_allclose(
        model.predict(x[:5], verbose=0), theirs["predictions"], rtol=1e-5, atol=1e-6
    )
    backend_worker.main(["--dir", str(tmp_path), "--epochs", "3", "--out", str(tmp_path / "c")])
    with open(tmp_path / "c") as f:
        again = json.load(f)
    assert again["resumed"] and again["iterations_at_start"] == 2 * backend_worker.STEPS
    assert list(again["slots_at_start"].values()) == list(theirs["slots_now"].values())


def _pretend_backend(monkeypatch, name: str) -> None:
    """What Keras reports under ``KERAS_BACKEND=name`` (without importing that backend)."""
    monkeypatch.setattr(backend.keras.backend, "backend", lambda: name)
    monkeypatch.setenv("KERAS_BACKEND", name)


def test_other_backends_are_refused_when_the_callback_is_made(tmp_path, monkeypatch):
    with det.core.init(
        storage=str(tmp_path / "c"), registry=f"sqlite:///{tmp_path}/r.db", trial_id=1
    ) as core:
        _pretend_backend(monkeypatch, "openvino")  # inference only: fit() does not run there
        with pytest.raises(errors.NotSupported) as info:
            det.keras.DeterminedCallback(core, None, continue_id=1)
    text = str(info.value)
    assert "'openvino'" in text and "KERAS_BACKEND=tensorflow or jax or torch" in text


@pytest.mark.parametrize("other", ["jax", "torch"])
def test_tfkerastrial_refuses_other_backends(tmp_path, monkeypatch, other):
    from ckptstore.keras_io.trial.controller import TrialController
    from tests.keras_io.trial.tiny_trial import TinyTrial

    with det.core.init(
        storage=str(tmp_path / "c"), registry=f"sqlite:///{tmp_path}/r.db", trial_id=1
    ) as core:
        _pretend_backend(monkeypatch, other)
        with pytest.raises(
            errors.NotSupported,
            match=f"TFKerasTrial runs on the Keras backends tensorflow, not '{other}'",
        ):
            TrialController(
                TinyTrial,
                core,
                {"searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}}},
            )


def test_without_tensorflow_jax_checkpoints_commit_without_a_savedmodel(
    tmp_path, monkeypatch, caplog
):
    import importlib.util

    find_spec = importlib.util.find_spec
    with det.core.init(
        storage=str(tmp_path / "c"), registry=f"sqlite:///{tmp_path}/r.db", trial_id=1
    ) as core:
        _pretend_backend(monkeypatch, "jax")
        monkeypatch.setattr(  # what an arm64 install without TensorFlow finds
            importlib.util,
            "find_spec",
            lambda n, *a: None if n == "tensorflow" else find_spec(n, *a),
        )
        cb = det.keras.DeterminedCallback(core, None, continue_id=1)
    assert cb._exports.policy.mode == "never"
    assert "commit without saved_model/" in caplog.text and "tensorflow-cpu" in caplog.text
