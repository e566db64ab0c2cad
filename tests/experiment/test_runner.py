"""The experiment runner end to end: the tutorial, a search, kill + resume, a script entrypoint
and config errors. Trials run in real subprocesses against local storage and a SQLite registry."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner

import ckptstore
from ckptstore import errors
from ckptstore.cli.main import cli
from ckptstore.experiment import create_experiment, describe_experiment
from ckptstore.experiment.searcher import optuna_storage_url, study_name
from ckptstore.registry import Registry

pytestmark = pytest.mark.e2e  # starts trial processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tfkeras_trial"
REPO = EXAMPLE.parents[1]


@pytest.fixture(autouse=True)
def _quiet_importable_children(monkeypatch):
    """The runner's trial processes import this checkout and log only warnings."""
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def write_config(tmp_path, name, source, **changes):
    raw = yaml.safe_load((EXAMPLE / source).read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_tutorial_runs_end_to_end(tmp_path, where):
    storage, registry = where
    # The tutorial's const.yaml with its step-style keys, scaled down: 10 steps of 2 batches.
    cfg = write_config(tmp_path, "const.yaml", "const.yaml", scheduling_unit=2)
    cfg_raw = yaml.safe_load(cfg.read_text())
    cfg_raw["searcher"]["max_steps"] = 10
    cfg_raw["min_validation_period"] = 5
    cfg.write_text(yaml.safe_dump(cfg_raw))
    result = CliRunner().invoke(
        cli,
        [
            "--storage",
            storage,
            "--registry",
            registry,
            "experiment",
            "create",
            str(cfg),
            str(EXAMPLE),
        ],
    )
    assert result.exit_code == 0, result.output
    exp_id = int(result.output.strip().split()[-1])
    info = describe_experiment(exp_id, registry=registry)
    assert info["state"] == "COMPLETED" and len(info["trials"]) == 1
    trial = info["trials"][0]
    assert trial["state"] == "COMPLETED" and trial["batches_trained"] == 20
    assert trial["hparams"]["global_batch_size"] == 32
    with Registry(registry) as reg:
        assert [m.steps_completed for m in reg.get_metrics(trial["id"], "validation")] == [10, 20]
        # metadata.json says how many workers trained it (one process here)
        assert reg.get_checkpoint(info["best_checkpoint"]).metadata["distributed"] == {"size": 1}
    model = ckptstore.load_checkpoint_model(
        checkpoint_uuid=info["best_checkpoint"], storage=storage, registry=registry
    )
    assert model.predict(__import__("numpy").zeros((2, 8, 8), "float32"), verbose=0).shape == (
        2,
        10,
    )
    shown = CliRunner().invoke(cli, ["--registry", registry, "experiment", "describe", str(exp_id)])
    assert shown.exit_code == 0 and info["best_checkpoint"] in shown.output
    listed = CliRunner().invoke(cli, ["--registry", registry, "experiment", "list", "--json"])
    assert json.loads(listed.output)[0]["id"] == exp_id


@pytest.mark.slow
def test_search_of_four_trials_picks_the_best(tmp_path, where):
    storage, registry = where
    cfg = write_config(
        tmp_path,
        "search.yaml",
        "search.yaml",
        searcher={"max_length": {"batches": 6}, "max_trials": 4, "max_concurrent_trials": 2},
        min_validation_period={"batches": 3},
        min_checkpoint_period={"batches": 3},
    )
    exp_id = create_experiment(cfg, EXAMPLE, storage=storage, registry=registry)
    info = describe_experiment(exp_id, registry=registry)
    trials = info["trials"]
    assert len(trials) == 4 and all(t["state"] == "COMPLETED" for t in trials)
    assert len({json.dumps(t["hparams"], sort_keys=True) for t in trials}) == 4
    best = max(trials, key=lambda t: t["best_metric"])
    assert info["best_trial"] == best["id"] and info["best_metric"] == best["best_metric"]
    with Registry(registry) as reg:
        best_ckpt = reg.get_checkpoint(info["best_checkpoint"])
        assert best_ckpt.trial_id == best["id"]
        # GC (save_trial_latest 1, save_trial_best 1): at most 2 live checkpoints per trial
        for t in trials:
            assert 1 <= len(reg.list_checkpoints(trial_id=t["id"], states=("COMMITTED",))) <= 2
    url, kwargs = optuna_storage_url(registry)
    with Registry(registry) as reg:
        name = study_name(exp_id, reg.get_experiment(exp_id).created_at)
    study = optuna.load_study(
        study_name=name, storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    )
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4
    assert study.best_value == pytest.approx(
        [
            m.metrics["val_accuracy"]
            for m in Registry(registry).get_metrics(best["id"], "validation")
        ][-1]
    )


def _wait_for(predicate, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_killed_runner_resumes_with_the_same_trial_count(tmp_path, where, monkeypatch):
    storage, registry = where
    # Who owns a trial is Optuna's heartbeat (no lease, no same-host shortcut): resume takes
    # the killed runner's trial once its heartbeat is 3 s old.
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_GRACE", "3")
    cfg = write_config(
        tmp_path,
        "kill.yaml",
        "search.yaml",
        searcher={"max_length": {"batches": 400}, "max_trials": 2},
        min_validation_period={"batches": 100},
        min_checkpoint_period={"batches": 50},
        scheduling_unit=50,
    )
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", storage, "--registry", registry]
    runner = subprocess.Popen([*cmd, "experiment", "create", str(cfg), str(EXAMPLE)])
    reg = Registry(registry)
    try:

        def first_checkpoint():
            trials = reg.list_trials()
            return bool(trials) and reg.latest_checkpoint(trials[0].id) is not None

        assert _wait_for(first_checkpoint), "no checkpoint was written"
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        trial = reg.list_trials()[0]
        # the trial process died with the runner: its checkpoint count stops moving
        time.sleep(3)
        seen = len(reg.get_metrics(trial.id))
        time.sleep(3)
        assert len(reg.get_metrics(trial.id)) == seen
        killed_at = reg.latest_checkpoint(trial.id).steps_completed
        assert trial.state == "ACTIVE" and killed_at < 400

        resumed = subprocess.run([*cmd, "experiment", "resume", "1"], timeout=400)
        assert resumed.returncode == 0
        trials = reg.list_trials(1)
        assert len(trials) == 2 and all(t.state == "COMPLETED" for t in trials)
        steps = [m.steps_completed for m in reg.get_metrics(trial.id, "training")]
        # the killed trial continued from its checkpoint: no step up to it was trained twice
        before = [s for s in steps if s <= killed_at]
        assert len(before) == len(set(before))
        assert max(steps) == 400
        assert reg.get_experiment(1).state == "COMPLETED"
        # Optuna failed the killed runner's trial and re-queued it; resume ran the retry
        url, kwargs = optuna_storage_url(registry)
        study = optuna.load_study(
            study_name=study_name(1, reg.get_experiment(1).created_at),
            storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs),
        )
        by_state = {
            s: [t.user_attrs["ckptstore_trial_id"] for t in study.trials if t.state == s]
            for s in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE)
        }
        assert by_state[optuna.trial.TrialState.FAIL] == [trial.id]
        assert sorted(by_state[optuna.trial.TrialState.COMPLETE]) == [t.id for t in trials]
    finally:
        if runner.poll() is None:
            runner.kill()
        reg.close()


TRAIN_PY = """
import ckptstore as det

info = det.get_trial_info()
units = info.trial.hparams["units"]
with det.core.init() as core_context:
    assert core_context.info.trial.trial_id == info.trial.trial_id
    with core_context.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
        open(f"{path}/units.txt", "w").write(str(units))  # path is a pathlib.Path, as in Determined
    core_context.train.report_validation_metrics(1, {"val_loss": abs(units - 5)})
"""


def test_script_entrypoint_gets_its_trial_through_the_environment(tmp_path, where):
    storage, registry = where
    model_dir = tmp_path / "script"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    raw = {
        "description": "script",
        "hyperparameters": {"units": {"type": "categorical", "vals": [1, 4, 9]}},
        "searcher": {
            "name": "grid",
            "metric": "val_loss",
            "max_length": {"batches": 1},
        },
        "entrypoint": f"{sys.executable} train.py",
    }
    exp_id = create_experiment(raw, model_dir, storage=storage, registry=registry)
    info = describe_experiment(exp_id, registry=registry)
    assert sorted(t["hparams"]["units"] for t in info["trials"]) == [1, 4, 9]
    assert all(t["state"] == "COMPLETED" for t in info["trials"])
    best = next(t for t in info["trials"] if t["id"] == info["best_trial"])
    assert best["hparams"]["units"] == 4 and info["best_metric"] == 1


def test_environment_variables_reach_local_trial_processes(tmp_path, where):
    """``environment.environment_variables`` (Determined's list) is set in each trial process
    the local runner starts (the Ray engine's case is in test_ray_settings.py)."""
    storage, registry = where
    model_dir = Path(__file__).resolve().parent / "ray_model"
    raw = {
        "entrypoint": f"{sys.executable} train.py",
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 5}},
        "environment": {"environment_variables": ["CKR_PROBE=local-probe", "CKR_SLEEP=0"]},
    }
    exp_id = create_experiment(raw, model_dir, storage=storage, registry=registry)
    with Registry(registry) as reg:
        (trial,) = reg.list_trials(exp_id)
        (ckpt,) = reg.list_checkpoints(trial_id=trial.id)
    assert trial.state == "COMPLETED" and ckpt.metadata["probe"] == "local-probe"


def test_bad_config_is_rejected_before_anything_runs(tmp_path, where):
    storage, registry = where
    bad = write_config(tmp_path, "bad.yaml", "const.yaml", searcher={"name": "bayesian"})
    result = CliRunner().invoke(
        cli,
        [
            "--storage",
            storage,
            "--registry",
            registry,
            "experiment",
            "create",
            str(bad),
            str(EXAMPLE),
        ],
    )
    assert result.exit_code == 2
    assert "searcher.name" in result.output
    missing = write_config(tmp_path, "missing.yaml", "const.yaml", entrypoint="nope:Trial")
    with pytest.raises(errors.InvalidConfig, match="module 'nope'"):
        create_experiment(missing, EXAMPLE, storage=storage, registry=registry)
    with Registry(registry) as reg:
        assert reg.list_experiments() == []
    assert not os.path.exists(storage) or not os.listdir(storage)


def test_unknown_experiment(where):
    _, registry = where
    result = CliRunner().invoke(cli, ["--registry", registry, "experiment", "describe", "42"])
    assert result.exit_code == 3


def test_example_folder_is_self_contained():
    assert shutil.which(sys.executable)
    for name in ("model_def.py", "const.yaml", "search.yaml"):
        assert (EXAMPLE / name).exists()


@pytest.mark.parametrize("dedup", [None, False])
def test_a_yaml_storage_dict_decides_dedup_for_its_trials(
    tmp_path, where, storage_url_factory, dedup
):
    """On S3 a trial's checkpoints are incremental (format 2) unless the experiment's
    ``checkpoint_storage`` says ``dedup: false``; the key reaches the trial's ``core.init``."""
    _, registry = where
    bucket = storage_url_factory("s3").split("://", 1)[1].split("/", 1)[0]
    model_dir = tmp_path / "script"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    storage = {"type": "s3", "bucket": bucket, "prefix": "exp"}
    if dedup is not None:
        storage["dedup"] = dedup
    raw = {
        "hyperparameters": {"units": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "entrypoint": f"{sys.executable} train.py",
        "checkpoint_storage": storage,
    }
    exp_id = create_experiment(raw, model_dir, registry=registry)
    info = describe_experiment(exp_id, registry=registry)
    assert [t["state"] for t in info["trials"]] == ["COMPLETED"]
    reg = Registry(registry)
    try:
        (ckpt,) = reg.list_checkpoints(trial_id=info["trials"][0]["id"])
    finally:
        reg.close()
    from ckptstore.checkpointing import format as fmt
    from ckptstore.storage_backends import open_storage

    with open_storage(f"s3://{bucket}/exp") as store:
        manifest = fmt.read_manifest(store, ckpt.uuid)
    assert manifest["format_version"] == (
        fmt.FORMAT_VERSION if dedup is False else fmt.BLOBS_FORMAT_VERSION
    )
