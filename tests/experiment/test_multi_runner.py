"""Two runners ("machines") work on one search through a shared PostgreSQL registry and one
storage folder: machine A runs ``experiment create``, machine B ``experiment join ID``. Together
they run exactly max_trials trials, each trial by exactly one of them, and the best is picked.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from ckptstore.keras_io.experiment import describe_experiment
from ckptstore.keras_io.experiment.searcher import optuna_storage_url, study_name
from ckptstore.registry import Registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tfkeras_trial"
REPO = EXAMPLE.parents[1]
STARTED = re.compile(r"Experiment (\d+): starting trial (\d+)")


def _config(tmp_path: Path) -> Path:
    raw = yaml.safe_load((EXAMPLE / "search.yaml").read_text())
    raw["searcher"].update(max_length={"batches": 6}, max_trials=4, max_concurrent_trials=1)
    raw["min_validation_period"] = {"batches": 3}
    raw["min_checkpoint_period"] = {"batches": 3}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_two_machines_share_one_search(tmp_path, monkeypatch, postgres_url_factory):
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # Leases shorter than a trial: only the heartbeat keeps each trial with its runner.
    monkeypatch.setenv("CKPTSTORE_TRIAL_LEASE_SECONDS", "3")
    registry_url = postgres_url_factory()
    storage = str(tmp_path / "ckpts")
    cfg = _config(tmp_path)
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "-v", "--storage", storage]
    cmd += ["--registry", registry_url, "experiment"]
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("a", "b")}  # noqa: SIM115
    procs: dict[str, subprocess.Popen] = {}
    reg = Registry(registry_url)
    try:
        procs["a"] = subprocess.Popen(
            [*cmd, "create", str(cfg), str(EXAMPLE)], stderr=logs["a"], stdout=logs["a"]
        )
        assert _wait_for(lambda: reg.list_experiments(), 60), "machine A created no experiment"
        exp_id = reg.list_experiments()[0].id
        procs["b"] = subprocess.Popen(
            [*cmd, "join", str(exp_id)], stderr=logs["b"], stdout=logs["b"]
        )
        for name, proc in procs.items():
            assert proc.wait(timeout=240) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

        started: dict[str, list[int]] = {}
        for name, log in logs.items():
            log.seek(0)
            started[name] = [int(t) for e, t in STARTED.findall(log.read()) if int(e) == exp_id]
        trials = reg.list_trials(exp_id)
        ids = sorted(t.id for t in trials)
        assert len(ids) == 4 and all(t.state == "COMPLETED" for t in trials)
        # each trial started by exactly one machine, once; both machines did some of the work
        assert sorted(started["a"] + started["b"]) == ids, started
        assert started["a"] and started["b"], started
        pids = {name: proc.pid for name, proc in procs.items()}
        for lease in reg.list_trial_leases(exp_id):
            owner = next(n for n in started if lease.trial_id in started[n])
            assert lease.owner.split(":")[1] == str(pids[owner])
            assert lease.claims == 1 and lease.released_at is not None
        for trial_id in ids:  # trained once: no step reported twice
            steps = [m.steps_completed for m in reg.get_metrics(trial_id, "training")]
            assert len(steps) == len(set(steps)) and max(steps) == 6
            val = [m.steps_completed for m in reg.get_metrics(trial_id, "validation")]
            assert val == [3, 6]
        assert reg.get_experiment(exp_id).state == "COMPLETED"

        info = describe_experiment(exp_id, registry=registry_url)
        assert len({json.dumps(t["hparams"], sort_keys=True) for t in info["trials"]}) == 4
        for t in info["trials"]:
            assert t["runner"] == reg.get_trial_lease(t["id"]).owner and not t["runner_active"]
        best = max(info["trials"], key=lambda t: t["best_metric"])
        assert info["best_trial"] == best["id"] and info["best_metric"] == best["best_metric"]
        assert reg.get_checkpoint(info["best_checkpoint"]).trial_id == best["id"]

        url, kwargs = optuna_storage_url(registry_url)
        study = optuna.load_study(
            study_name=study_name(exp_id),
            storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs),
        )
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert sorted(t.user_attrs["ckptstore_trial_id"] for t in complete) == ids
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs.values():
            log.close()
        reg.close()
