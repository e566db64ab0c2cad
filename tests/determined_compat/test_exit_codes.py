"""``experiment create`` exits non-zero when the experiment does not complete, naming the failed
trial and the end of its log; an experiment whose trials all failed is ERROR (issue 13.5)."""

import json

import pytest

from tests.determined_compat.conftest import ckptstore, copy_corpus

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
