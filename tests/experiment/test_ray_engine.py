"""The Ray engine on a real two-node Ray cluster on loopback (tests/servers/ray_cluster.py):
a 3-trial search placed on both nodes through ``ckptstore experiment create --engine ray``; the
second node is killed in the middle of a trial, Tune runs that trial again on the head, and it
continues from its latest ckptstore checkpoint. Then the registry, the study and the CLI show
the experiment as they show a local one. A driver killed mid-trial is continued by
``experiment resume --engine ray``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from ckptstore.experiment.searcher import TRIAL_ATTR, optuna_storage_url, study_name
from ckptstore.registry import Registry
from tests.experiment.waiting import wait_for
from tests.servers.ray_cluster import (
    CLUSTER_ENV,
    ray_cluster,  # noqa: F401 - the fixture
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tfkeras_trial"
REPO = EXAMPLE.parents[1]
LENGTH = 200
WORKER = "ckptstore.keras_io.trial.worker"

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, **searcher) -> Path:
    raw = yaml.safe_load((EXAMPLE / "search.yaml").read_text())
    raw["searcher"].update(max_length={"batches": LENGTH}, **searcher)
    raw.update(
        min_validation_period={"batches": 100},
        min_checkpoint_period={"batches": 50},
        scheduling_unit=50,
        max_restarts=2,
    )
    raw.pop("checkpoint_storage")
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _trial_processes(pids: set[int]) -> dict[int, int]:
    """{registry trial id: pid} of the trial processes among ``pids``."""
    out = {}
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if WORKER.encode() not in cmdline:
            continue
        for item in environ:
            if item.startswith(b"CKPTSTORE_TRIAL_ID="):
                out[int(item.split(b"=", 1)[1])] = pid
    return out


def _cli(tmp_path: Path, registry: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO),
        CKPTSTORE_HOME=str(tmp_path / "home"),
        CKPTSTORE_LOG_LEVEL="INFO",
        TF_CPP_MIN_LOG_LEVEL="3",
        CKPTSTORE_HEARTBEAT_INTERVAL="1",
        CKPTSTORE_HEARTBEAT_GRACE="4",
        **CLUSTER_ENV,
    )
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "-v", "--storage", str(tmp_path / "ckpts")]
    return [*cmd, "--registry", registry], env


def _resumed_from_checkpoint(reg: Registry, trial_id: int, killed_at: int) -> None:
    """No step up to the checkpoint trained twice; trained to the end; one continue_id."""
    steps = [m.steps_completed for m in reg.get_metrics(trial_id, "training")]
    before = [s for s in steps if s <= killed_at]
    assert len(before) == len(set(before)) and max(steps) == LENGTH
    ckpts = reg.list_checkpoints(trial_id=trial_id)
    assert {c.continue_id for c in ckpts} == {trial_id}
    assert max(c.steps_completed for c in ckpts) == LENGTH


TRAIN_PY = """
import keras
import numpy as np
import tensorflow as tf

import ckptstore as det

# Determined's multi-worker shape: the strategy from TF_CONFIG (Ray Train sets it per worker).
distributed, strategy = det.core.DistributedContext.from_tf_config()
units = det.get_trial_info().trial.hparams["units"]
x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = (x.sum(axis=1) * 1.5).astype("int64") % 3
with det.core.init(distributed=distributed) as core_context:
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(units, activation="relu"), keras.layers.Dense(3)]
        )
        model.compile(
            keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    callback = det.keras.DeterminedCallback(
        core_context,
        checkpoint=core_context.info.latest_checkpoint,
        continue_id=core_context.info.trial.trial_id,
        export_saved_model="never",
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model.fit(data, validation_data=data, epochs=2, verbose=0, callbacks=[callback])
    callback.wait()
"""


def test_two_slots_run_one_ray_train_worker_per_node(ray_cluster, tmp_path):  # noqa: F811
    """``resources.slots_per_trial: 2``: the trial's script runs as two Ray Train TensorFlow
    workers, one on each node, under MultiWorkerMirroredStrategy; the chief writes each
    checkpoint once and metadata.json says two workers trained it."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    model_dir = tmp_path / "dist"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(TRAIN_PY)
    cfg = tmp_path / "distributed.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "ray-two-slots",
                "entrypoint": "python3 train.py",
                "hyperparameters": {"units": {"type": "categorical", "vals": [8, 16]}},
                "searcher": {
                    "name": "grid",
                    "metric": "val_loss",
                    "max_length": {"batches": 8},
                    "max_trials": 2,
                },
                "resources": {"slots_per_trial": 2},
                "max_restarts": 1,
            }
        )
    )
    driver = subprocess.Popen(
        [*cmd, "experiment", "create", str(cfg), str(model_dir), "--engine", "ray"]
        + ["--address", ray_cluster.address],
        env=env,
        stdout=open(tmp_path / "driver.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    nodes_seen: set[str] = set()
    reg = Registry(registry)
    try:
        while driver.poll() is None:
            for node in ("h", "w"):
                pids = ray_cluster.processes(node)
                if any(b"train.py" in _cmdline(pid) for pid in pids):
                    nodes_seen.add(node)
            time.sleep(0.2)
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-4000:]
        assert nodes_seen == {"h", "w"}  # one worker per node
        trials = reg.list_trials(1)
        assert len(trials) == 2 and all(t.state == "COMPLETED" for t in trials)
        assert sorted(t.hparams["units"] for t in trials) == [8, 16]
        for trial in trials:
            ckpts = reg.list_checkpoints(trial_id=trial.id)
            steps = [c.steps_completed for c in ckpts]
            assert steps and len(steps) == len(set(steps))  # the chief wrote each once
            assert {json.dumps(c.metadata["distributed"]) for c in ckpts} == {'{"size": 2}'}
            assert reg.get_metrics(trial.id, "validation")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        reg.close()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_search_on_two_nodes_survives_a_lost_node(ray_cluster, tmp_path):  # noqa: F811
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    cfg = _config(tmp_path, max_trials=3, max_concurrent_trials=2)
    log = open(tmp_path / "driver.log", "w+")  # noqa: SIM115
    driver = subprocess.Popen(
        [*cmd, "experiment", "create", str(cfg), str(EXAMPLE), "--engine", "ray"]
        + ["--address", ray_cluster.address],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    reg = Registry(registry)
    try:

        def trial_on_second_node_with_checkpoint() -> int | None:
            for trial_id in _trial_processes(ray_cluster.processes("w")):
                ckpt = reg.latest_checkpoint(trial_id)
                if ckpt is not None and ckpt.steps_completed < LENGTH:
                    return trial_id
            return None

        killed = wait_for(trial_on_second_node_with_checkpoint, 400, interval=0.1)
        assert killed, (tmp_path / "driver.log").read_text()[-4000:]
        ray_cluster.kill_node("w")
        killed_at = reg.latest_checkpoint(killed).steps_completed

        assert driver.wait(timeout=600) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        trials = reg.list_trials(1)
        assert len(trials) == 3 and all(t.state == "COMPLETED" for t in trials)
        assert reg.get_experiment(1).state == "COMPLETED"
        _resumed_from_checkpoint(reg, killed, killed_at)

        url, kwargs = optuna_storage_url(registry)
        study = optuna.load_study(
            study_name=study_name(1), storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        )
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert sorted(t.user_attrs[TRIAL_ATTR] for t in complete) == [t.id for t in trials]

        # the CLI shows it as it shows a local experiment
        shown = subprocess.run(
            [*cmd, "experiment", "describe", "1", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        info = json.loads(shown.stdout)
        assert info["state"] == "COMPLETED" and len(info["trials"]) == 3
        best = reg.get_checkpoint(info["best_checkpoint"])
        assert best.trial_id == info["best_trial"] and best.steps_completed in (100, LENGTH)
        assert best.metadata["distributed"] == {"size": 1}
        verify = subprocess.run(
            [*cmd, "checkpoint", "verify", info["best_checkpoint"]], env=env, capture_output=True
        )
        assert verify.returncode == 0, verify.stderr[-2000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
        reg.close()


def test_lost_driver_is_continued_by_resume_on_ray(ray_cluster, tmp_path):  # noqa: F811
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    cfg = _config(tmp_path, max_trials=1, max_concurrent_trials=1)
    create = [*cmd, "experiment", "create", str(cfg), str(EXAMPLE), "--engine", "ray"]
    driver = subprocess.Popen([*create, "--address", ray_cluster.address], env=env)
    reg = Registry(registry)
    try:

        def checkpointed() -> bool:
            trials = reg.list_trials()
            ckpt = reg.latest_checkpoint(trials[0].id) if trials else None
            return ckpt is not None and ckpt.steps_completed < LENGTH

        assert wait_for(checkpointed, 400), "no checkpoint before the end"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        trial_id = reg.list_trials()[0].id
        killed_at = reg.latest_checkpoint(trial_id).steps_completed
        # Ray ends a dead driver's trials; the trial process goes with them
        assert wait_for(lambda: not _trial_processes(ray_cluster.processes("h")), 60)

        resumed = subprocess.run(
            [*cmd, "experiment", "resume", "1", "--engine", "ray", "--address"]
            + [ray_cluster.address],
            env=env,
            timeout=600,
        )
        assert resumed.returncode == 0
        assert reg.get_trial(trial_id).state == "COMPLETED" and len(reg.list_trials()) == 1
        _resumed_from_checkpoint(reg, trial_id, killed_at)
    finally:
        if driver.poll() is None:
            driver.kill()
        reg.close()


@pytest.mark.parametrize(
    ("resources", "error", "match"),
    [
        ({"slots_per_trial": 2}, "NotSupported", "slots_per_trial=2 with entrypoint model_def"),
        ({"slots_per_trial": 0}, "InvalidConfig", "slots_per_trial"),
    ],
)
def test_unrunnable_slots_are_refused_before_ray_starts(tmp_path, resources, error, match):
    from ckptstore import errors
    from ckptstore.experiment import create_experiment

    raw = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    raw["resources"] = resources
    raw.pop("checkpoint_storage", None)
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    with pytest.raises(getattr(errors, error), match=match):
        create_experiment(
            raw, EXAMPLE, storage=str(tmp_path / "ckpts"), registry=registry, engine="ray"
        )
    with Registry(registry) as reg:
        assert reg.list_experiments() == []  # refused before anything was recorded
    with pytest.raises(errors.InvalidConfig, match="engine='spark'"):
        create_experiment(raw, EXAMPLE, registry=registry, engine="spark")
