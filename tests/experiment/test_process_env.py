"""The environment of processes ckptstore starts for user code has one builder
(common.child_process_env): a trial locally, the same trial on a Ray node, a job and
``ckptstore run`` get the same keys for the same settings."""

import json
import os
import sys

from ckptstore.core import _info as trial_info
from ckptstore.experiment import create_experiment
from ckptstore.experiment.common import (
    MODEL_DIR_ENV,
    OPTUNA_TRIAL_ENV,
    child_process_env,
    trial_env,
)
from ckptstore.experiment.jobs import _job_env
from ckptstore.experiment.runner import ExperimentRun
from ckptstore.launch.process import ALIAS_DIR, ALIAS_ENV
from ckptstore.launch.tensorflow import SLOTS_ENV
from ckptstore.registry import Registry
from ckptstore.storage_backends.spec import resolve


def test_settings_override_none_removes_and_the_alias_comes_first():
    base = {"PYTHONPATH": f"/old{os.pathsep}{ALIAS_DIR}", "KEEP": "1", "DROP": "x"}
    env = child_process_env(base, {"DROP": None, "NEW": "2"}, model_dir="/model", who="me")
    assert env["KEEP"] == "1" and env["NEW"] == "2" and "DROP" not in env
    assert env["PYTHONPATH"].split(os.pathsep) == [ALIAS_DIR, "/model", "/old"]
    assert env[ALIAS_ENV] == "me"


def test_trial_and_job_get_the_same_run_keys(tmp_path, monkeypatch):
    monkeypatch.setenv(OPTUNA_TRIAL_ENV, "99")  # a stale key from the launching process
    raw = {
        "hyperparameters": {"units": 4},
        "searcher": {"name": "single", "metric": "val_loss"},
        "entrypoint": f"{sys.executable} train.py",
        "data": {"rows": 3},
        "resources": {"slots_per_trial": 2, "slots": 2},
    }
    registry_url = f"sqlite:///{tmp_path / 'r.db'}"
    storage = str(tmp_path / "st")
    exp_id = create_experiment(raw, tmp_path, storage=storage, registry=registry_url, run=False)
    with Registry(registry_url) as registry:
        run = ExperimentRun(exp_id, registry, registry_url, storage)
        experiment = run.experiment_env()
        trial = trial_env(dict(os.environ), experiment, 7, {"units": 4}, None)
    job = _job_env(5, run.config, resolve(storage), registry_url, str(tmp_path))
    shared = (
        trial_info.STORAGE_ENV,
        trial_info.REGISTRY_ENV,
        trial_info.DATA_CONFIG_ENV,
        SLOTS_ENV,
        "PYTHONPATH",
    )
    assert {k: trial[k] for k in shared} == {k: job[k] for k in shared}
    assert json.loads(trial[trial_info.DATA_CONFIG_ENV]) == {"rows": 3}
    assert trial[trial_info.TRIAL_ID_ENV] == "7" and trial[MODEL_DIR_ENV] == str(tmp_path)
    assert OPTUNA_TRIAL_ENV not in trial  # None removes the launcher's stale value
    assert job[trial_info.JOB_ID_ENV] == "5" and trial_info.TRIAL_ID_ENV not in job
    # The experiment's keys never carry the driver's PYTHONPATH: a Ray node builds its own.
    assert "PYTHONPATH" not in experiment and ALIAS_ENV not in experiment


def test_retention_keys_reach_gc_by_one_route_for_scripts_and_tfkerastrial(tmp_path, monkeypatch):
    """A config's GC keys ride in the trial's CKPTSTORE_STORAGE (a StorageConfig): a script's
    core.init and the TFKerasTrial worker both build their policy from it, whether the keys
    came in a typed storage block, in a block of GC keys alone (the default storage), or with
    a storage named by the caller."""
    from ckptstore import core
    from ckptstore.checkpointing.retention import GCPolicy, run_retention
    from ckptstore.storage_backends.spec import resolve

    registry_url = f"sqlite:///{tmp_path / 'r.db'}"
    folder = str(tmp_path / "st")
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CKPTSTORE_STORAGE", raising=False)
    cases = [
        ({"type": "directory", "container_path": folder, "save_trial_latest": 3}, None),
        ({"save_trial_best": 2}, None),
        ({"save_trial_latest": 2, "save_experiment_best": 1}, folder),
    ]
    for block, given in cases:
        raw = {
            "hyperparameters": {"units": 4},
            "searcher": {"name": "single", "metric": "val_loss"},
            "entrypoint": f"{sys.executable} train.py",
            "checkpoint_storage": block,
        }
        exp_id = create_experiment(raw, tmp_path, storage=given, registry=registry_url, run=False)
        with Registry(registry_url) as registry:
            run = ExperimentRun(exp_id, registry, registry_url, given)
            env = trial_env(dict(os.environ), run.experiment_env(), 7, {"units": 4}, None)
        keys = {k: v for k, v in block.items() if k.startswith("save_")}
        worker = run_retention(resolve(environ=env).retention, trial_class=True)
        assert worker == run.config.gc_settings() == {**run_retention({}, trial_class=True), **keys}
        monkeypatch.setenv(trial_info.STORAGE_ENV, env[trial_info.STORAGE_ENV])
        with core.init(registry=registry_url, set_trial_state=False, preempt_signals=False) as ctx:
            assert ctx.checkpoint.gc_policy == GCPolicy.from_determined(**keys)
        monkeypatch.delenv(trial_info.STORAGE_ENV)
