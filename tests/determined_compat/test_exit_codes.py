"""``experiment create`` exits non-zero when the experiment does not complete, naming the failed
trial and the end of its log; an experiment whose trials all failed is ERROR (issue 13.5)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ckptstore.registry import Registry
from tests.determined_compat.conftest import (
    CLI_TIMEOUT_S,
    ckptstore,
    cli_env,
    copy_corpus,
    paused_at,
    resume_ok,
)

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end


def test_failing_trial_fails_the_command_and_the_experiment(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("failing", tmp_path)
    # After the traceback, exit noise (as TensorFlow's or another worker's shutdown prints)
    # pushes the error out of the last 20 lines: the message still shows it.
    script = model_dir / "train.py"
    script.write_text(
        "import atexit\n"
        "atexit.register(lambda: print(*(f'worker thread {i} stopped' for i in range(30)), "
        "sep='\\n', flush=True))\n" + script.read_text()
    )
    done = ckptstore(
        "experiment", "create", "const.yaml", ".", storage=storage, registry=registry, cwd=model_dir
    )
    assert done.returncode == 1
    assert "Trial 1 ERROR (exit status 1)" in done.stderr
    error = "FileNotFoundError: training data not found: /data/missing.csv"
    assert f"| {error}\n  | ...\n" in done.stderr
    assert "| trial 1 starting" in done.stderr and "| worker thread 29 stopped" in done.stderr
    # Run again (or on another runner), the failed trial's message comes from its stored log.
    again = ckptstore("experiment", "resume", "1", storage=storage, registry=registry)
    assert again.returncode == 1
    assert "Trial 1 ERROR. Last lines of its log:" in again.stderr
    assert f"| {error}" in again.stderr and "(no output)" not in again.stderr
    info = json.loads(
        ckptstore(
            "experiment", "describe", "1", "--json", storage=storage, registry=registry
        ).stdout
    )
    assert info["state"] == "ERROR" and info["trials"][0]["state"] == "ERROR"


def test_one_failed_trial_of_a_search_still_fails_the_command(tmp_path, where):
    storage, registry = where
    model_dir = copy_corpus("failing", tmp_path)
    # Trial with lr 0.1 fails, lr 0.2 succeeds: the experiment completes, the command says no.
    (model_dir / "train.py").write_text(
        "import determined as det\n"
        "info = det.get_cluster_info()\n"
        "with det.core.init() as core_context:\n"
        "    core_context.train.report_validation_metrics(1, {'val_loss': 1.0})\n"
        "if info.trial.hparams['lr'] == 0.1:\n"
        "    raise SystemExit('diverged: loss is nan')\n"
    )
    (model_dir / "grid.yaml").write_text(
        "hyperparameters:\n  lr: {type: categorical, vals: [0.1, 0.2]}\n"
        "searcher: {name: grid, metric: val_loss}\nentrypoint: python3 train.py\n"
    )
    done = ckptstore(
        "experiment", "create", "grid.yaml", ".", storage=storage, registry=registry, cwd=model_dir
    )
    assert done.returncode == 1
    assert "ended COMPLETED with 1 failed trial(s)" in done.stderr
    assert "Trial 1 ERROR" in done.stderr and "diverged: loss is nan" in done.stderr
    info = json.loads(
        ckptstore(
            "experiment", "describe", "1", "--json", storage=storage, registry=registry
        ).stdout
    )
    assert info["state"] == "COMPLETED"
    assert sorted(t["state"] for t in info["trials"]) == ["COMPLETED", "ERROR"]


def test_python3_is_the_interpreter_running_ckptstore(tmp_path, where, monkeypatch):
    """The reference's `python3 train.py` with a PATH whose python3 has no ckptstore/numpy."""
    storage, registry = where
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text("#!/bin/sh\necho 'wrong python3 on PATH' >&2\nexit 7\n")
    fake.chmod(0o755)
    (model_dir / "train.py").write_text(
        "import sys, determined as det\n"
        "with det.core.init() as ctx:\n"
        "    ctx.train.report_validation_metrics(1, {'val_loss': 0.5})\n"
        "print('INTERPRETER', sys.executable)\n"
    )
    (model_dir / "const.yaml").write_text(
        "hyperparameters: {a: 1}\nentrypoint_script: python3 train.py\n"
    )
    import os
    import sys

    done = ckptstore(
        "experiment",
        "create",
        "const.yaml",
        ".",
        storage=storage,
        registry=registry,
        cwd=model_dir,
        PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"INTERPRETER {sys.executable}" in done.stdout + done.stderr


# A Core API script that checkpoints every step and stops when asked (Ctrl-C reaches it too).
STEPS_PY = """
import time

import determined as det

with det.core.init() as core_context:
    latest = det.get_cluster_info().latest_checkpoint
    step = 0
    if latest:
        with core_context.checkpoint.restore_path(latest) as path:
            step = int((path / "step.txt").read_text())
    while step < 30:
        step += 1
        time.sleep(0.2)
        core_context.train.report_validation_metrics(step, {"val_loss": 1.0 / step})
        with core_context.checkpoint.store_path({"steps_completed": step}) as (path, _):
            (path / "step.txt").write_text(str(step))
        if core_context.preempt.should_preempt():
            break
"""


def _create_in_own_group(tmp_path, storage, registry, train_py):
    """``experiment create`` of a single-trial ``train_py`` in its own process group, as a
    shell runs a foreground job (so killpg is Ctrl-C): (model folder, the process)."""
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(train_py)
    (model_dir / "const.yaml").write_text(
        "searcher: {name: single, metric: val_loss}\nentrypoint: python3 train.py\n"
    )
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", storage, "--registry", registry]
    run = subprocess.Popen(
        [*cmd, "experiment", "create", "const.yaml", "."],
        cwd=model_dir,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return model_dir, run


def test_ctrl_c_pauses_the_experiment_and_exits_130(tmp_path, where):
    """Ctrl-C in a terminal (SIGINT to the command's process group: the runner and its trial):
    the trial checkpoints, the experiment is PAUSED, the command says how to go on and exits
    130 (reference/errors.md); `experiment resume` finishes it from the checkpoint."""
    storage, registry = where
    model_dir, run = _create_in_own_group(tmp_path, storage, registry, STEPS_PY)
    deadline = time.monotonic() + CLI_TIMEOUT_S
    checkpointed = False
    while not checkpointed and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.3)
        try:
            with Registry(registry) as reg:
                checkpointed = reg.latest_checkpoint(1) is not None
        except Exception:  # noqa: BLE001 - the registry or trial may not exist yet
            pass
    assert checkpointed, run.communicate(timeout=60)[1][-3000:]
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=CLI_TIMEOUT_S)
    assert run.returncode == 130, err[-3000:]
    assert "ExperimentInterrupted: Experiment 1 was interrupted by Ctrl-C (SIGINT)" in err
    assert "is PAUSED; continue it with `ckptstore experiment resume 1`" in err
    cut = paused_at(registry)
    assert 0 < cut < 30
    with Registry(registry) as reg:
        assert reg.get_experiment(1).state == "PAUSED"
    resume_ok(model_dir, storage, registry)
    with Registry(registry) as reg:
        assert reg.get_experiment(1).state == "COMPLETED"
        steps = [row.steps_completed for row in reg.get_metrics(1, "validation")]
    assert steps == list(range(1, 31))  # went on after the checkpoint, nothing trained twice


def test_ctrl_c_on_a_script_without_a_preemption_check_pauses_its_trial(tmp_path, where):
    """A script that never asks should_preempt() dies of Ctrl-C (KeyboardInterrupt, exit
    status != 0): its trial shows PAUSED, not ACTIVE, like the experiment, and the command
    still exits 130."""
    storage, registry = where
    sleeper = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
    _, run = _create_in_own_group(tmp_path, storage, registry, sleeper)
    assert run.stdout.readline().strip().endswith("up"), run.communicate(timeout=60)[1][-3000:]
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=CLI_TIMEOUT_S)
    assert run.returncode == 130, err[-3000:]
    with Registry(registry) as reg:
        (trial,) = reg.list_trials(1)
        assert (reg.get_experiment(1).state, trial.state) == ("PAUSED", "PAUSED")
