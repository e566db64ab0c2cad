"""Helpers for the Determined compatibility corpus: run the ``ckptstore`` command as a user
would (a subprocess of this checkout's ckptstore) against fresh local or S3 storage."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptstore.registry import Registry
from tests._helpers.jax_env import repo_pythonpath

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
CLI_TIMEOUT_S = 300


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: this checkout importable, quiet TensorFlow."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(extra)
    if env.get("KERAS_BACKEND") in ("jax", "torch"):  # outside the venv (jax_env.py)
        env["PYTHONPATH"] = repo_pythonpath(env["KERAS_BACKEND"])
    return env


def ckptstore(
    *args: str, storage: str, registry: str, cwd: str | Path | None = None, **env: str
) -> subprocess.CompletedProcess:
    """``ckptstore --storage S --registry R ARGS...``; returns the finished process."""
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", storage, "--registry", registry]
    return subprocess.run(
        [*cmd, *args],
        cwd=cwd,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def copy_corpus(name: str, tmp_path: Path) -> Path:
    """A fresh copy of one corpus folder (runs must not write into the repository)."""
    target = tmp_path / name
    shutil.copytree(CORPUS / name, target)
    return target


def create_ok(
    config: str, model_dir: Path, storage: str, registry: str
) -> subprocess.CompletedProcess:
    """``ckptstore experiment create CONFIG .`` in ``model_dir``; fails the test unless it exits 0."""
    done = ckptstore(
        "experiment", "create", config, ".", storage=storage, registry=registry, cwd=model_dir
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def paused_at(registry: str, trial_id: int = 1) -> int:
    """The step of trial ``trial_id``'s latest checkpoint; fails the test unless it is PAUSED."""
    with Registry(registry) as reg:
        assert reg.get_trial(trial_id).state == "PAUSED"
        return reg.latest_checkpoint(trial_id).steps_completed


@pytest.fixture
def trial_env(tmp_path):
    """``(storage folder, Registry)`` for trials run in this process; afterwards no trial of
    ``tf_keras_port_trials`` is asked to preempt."""
    registry = Registry(f"sqlite:///{tmp_path / 'reg.db'}")
    yield str(tmp_path / "ckpts"), registry
    from tests.determined_compat import tf_keras_port_trials

    tf_keras_port_trials.PREEMPTION.update(preempt=None, at=None)
    registry.close()


def resume_ok(
    model_dir: Path | None, storage: str, registry: str, experiment_id: str = "1"
) -> subprocess.CompletedProcess:
    """``ckptstore experiment resume ID`` in ``model_dir``; fails the test unless it exits 0."""
    done = ckptstore(
        "experiment", "resume", experiment_id, storage=storage, registry=registry, cwd=model_dir
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def create_then_sigterm(
    config: str,
    model_dir: Path,
    storage: str,
    registry: str,
    ready: Callable[[Registry], object],
    **env: str,
) -> str:
    """``ckptstore experiment create CONFIG .`` in the background, SIGTERM once
    ``ready(registry)`` is truthy; asserts the run stopped as PAUSED with the resume hint and
    returns its stderr."""
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", storage, "--registry", registry]
    runner = subprocess.Popen(
        [*cmd, "experiment", "create", config, "."],
        cwd=model_dir,
        env=cli_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    seen = None
    while not seen and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.3)
        try:
            with Registry(registry) as reg:
                seen = ready(reg)
        except Exception:  # noqa: BLE001 - the registry or trial may not exist yet
            seen = None
    assert seen, "the run did not get far enough before the deadline"
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=120)
    # Interrupted: not completed, so the command fails and says how to continue.
    assert runner.returncode != 0
    assert "PAUSED" in err and "ckptstore experiment resume 1" in err
    return err
