"""Two runners ("machines") share one 4-trial search through a PostgreSQL registry and one
storage folder: machine A runs ``experiment create``, machine B ``experiment join ID``. B is
SIGKILLed in the middle of a trial; Optuna's heartbeat marks that trial stale, its retry
callback re-queues it, and A continues it from its latest checkpoint (same registry trial, same
continue_id). Every trial completes exactly once and no registry trial is created twice.
"""

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from ckptstore.experiment import describe_experiment
from ckptstore.experiment.optuna_queue import RUNNER_ATTR, runners
from ckptstore.experiment.searcher import TRIAL_ATTR, optuna_storage_url, study_name
from ckptstore.registry import Registry
from tests.experiment.waiting import wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tfkeras_trial"
REPO = EXAMPLE.parents[1]
STARTED = re.compile(r"Experiment (\d+): starting trial (\d+)")
LENGTH = 400


def _config(tmp_path: Path) -> Path:
    raw = yaml.safe_load((EXAMPLE / "search.yaml").read_text())
    raw["searcher"].update(max_length={"batches": LENGTH}, max_trials=4, max_concurrent_trials=1)
    raw["min_validation_period"] = {"batches": 200}
    raw["min_checkpoint_period"] = {"batches": 50}
    raw["scheduling_unit"] = 50
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_survivor_continues_the_trial_of_a_killed_runner(
    tmp_path, monkeypatch, postgres_url_factory
):
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "INFO")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # Optuna's heartbeat every second; a trial without one for 4 s is stale and re-queued.
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_GRACE", "4")
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
        assert wait_for(reg.list_experiments, 60), "machine A created no experiment"
        exp_id = reg.list_experiments()[0].id
        procs["b"] = subprocess.Popen(
            [*cmd, "join", str(exp_id)], stderr=logs["b"], stdout=logs["b"]
        )
        b_name = f":{procs['b'].pid}"

        def b_trial_with_checkpoint() -> int | None:
            for trial_id, (runner, active) in runners(registry_url, exp_id).items():
                if active and runner and runner.endswith(b_name):
                    ckpt = reg.latest_checkpoint(trial_id)
                    if ckpt is not None and ckpt.steps_completed < LENGTH:
                        return trial_id
            return None

        killed = wait_for(b_trial_with_checkpoint, 180, interval=0.25)
        assert killed, (tmp_path / "b.log").read_text()[-3000:]
        procs["b"].send_signal(signal.SIGKILL)
        procs["b"].wait()
        killed_at = reg.latest_checkpoint(killed).steps_completed

        assert procs["a"].wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
        logs["a"].seek(0)
        a_log = logs["a"].read()
        started_by_a = [int(t) for e, t in STARTED.findall(a_log) if int(e) == exp_id]
        assert killed in started_by_a, a_log[-3000:]  # the survivor ran the killed trial
        assert "lost its runner" in a_log

        trials = reg.list_trials(exp_id)
        ids = sorted(t.id for t in trials)
        assert len(ids) == 4 and all(t.state == "COMPLETED" for t in trials)  # no duplicates
        assert len({json.dumps(t.hparams, sort_keys=True) for t in trials}) == 4
        assert reg.get_experiment(exp_id).state == "COMPLETED"

        # The killed trial went on from its checkpoint: no step up to it trained twice, the
        # first checkpoint after the kill is later than it, all under one continue_id.
        steps = [m.steps_completed for m in reg.get_metrics(killed, "training")]
        before = [s for s in steps if s <= killed_at]
        assert len(before) == len(set(before)) and max(steps) == LENGTH
        ckpts = sorted(reg.list_checkpoints(trial_id=killed), key=lambda c: c.steps_completed)
        assert {c.continue_id for c in ckpts} == {killed}
        assert ckpts[-1].steps_completed == LENGTH
        for other in set(ids) - {killed}:  # the other trials trained once
            other_steps = [m.steps_completed for m in reg.get_metrics(other, "training")]
            assert len(other_steps) == len(set(other_steps)) and max(other_steps) == LENGTH

        url, kwargs = optuna_storage_url(registry_url)
        study = optuna.load_study(
            study_name=study_name(exp_id, reg.get_experiment(exp_id).created_at),
            storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs),
        )
        state = optuna.trial.TrialState
        complete = [t for t in study.trials if t.state == state.COMPLETE]
        # every trial completed exactly once in the study
        assert sorted(t.user_attrs[TRIAL_ATTR] for t in complete) == ids
        failed = [t for t in study.trials if t.state == state.FAIL]
        assert [t.user_attrs[TRIAL_ATTR] for t in failed] == [killed]
        assert failed[0].user_attrs[RUNNER_ATTR].endswith(b_name)
        retry = next(t for t in complete if t.user_attrs[TRIAL_ATTR] == killed)
        retried = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(retry)
        assert retried == failed[0].number
        assert retry.user_attrs[RUNNER_ATTR].endswith(f":{procs['a'].pid}")
        assert retry.params == failed[0].params

        info = describe_experiment(exp_id, registry=registry_url)
        assert not any(t["runner_active"] for t in info["trials"])
        assert {t["runner"].split(":")[1] for t in info["trials"]} <= {
            str(p.pid) for p in procs.values()
        }
        best = max(info["trials"], key=lambda t: t["best_metric"])
        assert info["best_trial"] == best["id"] and info["best_metric"] == best["best_metric"]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs.values():
            log.close()
        reg.close()
