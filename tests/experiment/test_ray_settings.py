"""The Ray engine as users run it (issue 29): nodes started from a plain shell (the session's
two-node loopback cluster has no ``CKPTSTORE_*`` or ``AWS_*`` in its environment), PostgreSQL
and the S3 emulator. Whatever the trials need comes from the driver, whether the driver got
its settings from environment variables or from flags; ``environment.environment_variables``
reaches the trial processes; SIGTERM to the driver pauses the trials at a checkpoint and
``experiment resume --engine ray`` continues them; a driver on another host than the nodes
is refused a SQLite registry and a local folder before any trial starts.

The trials run ``ray_model/train.py`` (a Core API script without NumPy or TensorFlow), so
these tests cost the cluster's start-up (shared with test_ray_engine.py) and a few seconds of
Ray scheduling each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests._helpers.ports import free_port
from tests.experiment.waiting import wait_for
from tests.servers.ray_cluster import CLUSTER_ENV, cmdline

MODEL = Path(__file__).resolve().parent / "ray_model"
REPO = MODEL.parents[2]
PROBE = "probe-value-7f3a"

pytestmark = pytest.mark.e2e


def _model_dir(tmp_path: Path, *, length: int, trials: int, env: list[str]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "train.py").write_text((MODEL / "train.py").read_text())
    config = {
        "name": "ray-settings",
        "entrypoint": "python3 train.py",
        "hyperparameters": {"x": {"type": "int", "minval": 1, "maxval": 9}},
        "searcher": {
            "name": "random",
            "metric": "loss",
            "smaller_is_better": True,
            "max_length": {"batches": length},
            "max_trials": trials,
            "max_concurrent_trials": trials,
        },
        "environment": {"environment_variables": [f"CKR_PROBE={PROBE}", *env]},
    }
    (folder / "exp.yaml").write_text(yaml.safe_dump(config))
    return folder


def _driver_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The driver's environment: this process's without ckptstore's or the S3 emulator's
    variables, plus ``settings``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CKPTSTORE_", "AWS_", "RAY_ADDRESS"))
    }
    env.update(
        PYTHONPATH=str(REPO),
        CKPTSTORE_HOME=str(tmp_path / "home"),
        CKPTSTORE_HEARTBEAT_INTERVAL="1",
        CKPTSTORE_HEARTBEAT_GRACE="4",
        **CLUSTER_ENV,
        **settings,
    )
    return env


def _ckptstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptstore.cli.main", *args]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _checkpoints_in(storage: str | dict) -> set[str]:
    """The committed checkpoint UUIDs in a storage (what the trials wrote there)."""
    with open_storage(storage) as store:
        return {e.split("/", 1)[0] for e in store.list("") if e.endswith("/metadata.json")}


def test_settings_from_driver_environment_reach_clean_nodes(
    ray_cluster, postgres_url_factory, storage_url_factory, s3_server, tmp_path
):
    """CKPTSTORE_REGISTRY (PostgreSQL) and CKPTSTORE_STORAGE (a JSON checkpoint_storage block
    for the S3 emulator, credentials in it) in the driver's environment only: both trials run
    on nodes that have neither, and land in that registry and that bucket, with the config's
    environment variable set."""
    registry = postgres_url_factory()
    bucket = storage_url_factory("s3").split("/")[2]
    storage = {
        "type": "s3",
        "bucket": bucket,
        "prefix": "ckpts",
        "endpoint_url": s3_server.env["AWS_ENDPOINT_URL"],
        "access_key": s3_server.env["AWS_ACCESS_KEY_ID"],
        "secret_key": s3_server.env["AWS_SECRET_ACCESS_KEY"],
    }
    model = _model_dir(tmp_path, length=10, trials=2, env=[])
    env = _driver_env(tmp_path, CKPTSTORE_REGISTRY=registry, CKPTSTORE_STORAGE=json.dumps(storage))
    create = ["experiment", "create", "exp.yaml", ".", "--engine", "ray"]
    done = _run(_ckptstore(*create, "--address", ray_cluster.address), model, env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with Registry(registry) as reg:
        trials = reg.list_trials(1)
        assert len(trials) == 2 and {t.state for t in trials} == {"COMPLETED"}
        ckpts = [c for t in trials for c in reg.list_checkpoints(trial_id=t.id)]
    assert {c.metadata["probe"] for c in ckpts} == {PROBE}
    assert {c.metadata["node"] for c in ckpts} <= {"h", "w"}
    assert {c.uuid for c in ckpts} == _checkpoints_in(storage)
    assert len(ckpts) == 4  # batches 5 and 10 of each trial


def _trial_pids(ray_cluster) -> set[int]:
    return {
        pid for node in "hw" for pid in ray_cluster.processes(node) if b"train.py" in cmdline(pid)
    }


def test_flags_sigterm_pauses_then_resume_on_ray_continues(
    ray_cluster, postgres_url_factory, storage_url_factory, s3_server, tmp_path
):
    """``--registry``/``--storage`` flags, the S3 emulator's endpoint and keys reaching the
    nodes through ``environment.environment_variables`` only. SIGTERM to the driver: the trial
    checkpoints and exits, the trial and the experiment are PAUSED and the driver exits
    non-zero saying so; ``experiment resume --engine ray`` continues from that checkpoint."""
    registry = postgres_url_factory()
    storage = storage_url_factory("s3")
    s3_env = [f"{k}={v}" for k, v in s3_server.env.items() if k.startswith("AWS_")]
    model = _model_dir(tmp_path, length=40, trials=1, env=[*s3_env, "CKR_SLEEP=0.25"])
    env = {**_driver_env(tmp_path), **s3_server.env}  # the driver opens the storage too
    flags = ["--registry", registry, "--storage", storage]
    ray_args = ["--engine", "ray", "--address", ray_cluster.address]
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            _ckptstore(*flags, "experiment", "create", "exp.yaml", ".", *ray_args),
            cwd=model,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    reg = Registry(registry)
    try:

        def checkpointed() -> bool:
            trials = reg.list_trials()
            return bool(trials) and reg.latest_checkpoint(trials[0].id) is not None

        assert wait_for(checkpointed, 300), log.read_text()[-4000:]
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=120) == 1, log.read_text()[-4000:]
        output = log.read_text()
        resume = f"experiment resume 1 --engine ray --address {ray_cluster.address}"
        assert "PAUSED" in output and resume in output, output[-4000:]
        (trial,) = reg.list_trials(1)
        assert reg.get_trial(trial.id).state == "PAUSED"
        assert reg.get_experiment(1).state == "PAUSED"
        paused_at = reg.latest_checkpoint(trial.id).steps_completed
        assert 0 < paused_at < 40
        assert not _trial_pids(ray_cluster), "the trial process outlived its pause"

        resumed = _run(_ckptstore(*flags, "experiment", "resume", "1", *ray_args), model, env)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
        assert reg.get_trial(trial.id).state == "COMPLETED"
        steps = [m.steps_completed for m in reg.get_metrics(trial.id, "training")]
        assert steps == list(range(5, 41, 5))  # each step once: resumed at the checkpoint
        ckpts = reg.list_checkpoints(trial_id=trial.id)
        assert {c.metadata["probe"] for c in ckpts} == {PROBE}
        assert {c.uuid for c in ckpts} == _checkpoints_in(storage)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        reg.close()


def test_driver_on_another_host_refuses_local_registry_and_storage(ray_cluster, tmp_path):
    """The driver runs under another hostname (its own UTS namespace: a laptop driving the
    cluster): a SQLite registry and a local folder are refused, exit 2, before any trial
    starts, with the fix in the message."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    model = _model_dir(tmp_path, length=10, trials=1, env=[])
    create = _ckptstore("--registry", registry, "--storage", str(tmp_path / "ckpts"))
    create += ["experiment", "create", "exp.yaml", ".", "--engine", "ray"]
    create += ["--address", ray_cluster.address]
    unshare = ["unshare", "--uts"] if os.geteuid() == 0 else ["unshare", "-Ur", "--uts"]
    script = f"hostname ckr-laptop && exec {subprocess.list2cmdline(create)}"
    done = _run([*unshare, "sh", "-c", script], model, _driver_env(tmp_path))
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    assert "UnreachableFromCluster" in done.stderr
    assert "SQLite file" in done.stderr and "folder on this machine" in done.stderr
    assert "postgresql://" in done.stderr and "s3://" in done.stderr  # the fix
    with Registry(registry) as reg:
        assert reg.list_trials(1) == [] and reg.get_experiment(1).state == "PAUSED"


def test_an_address_nobody_answers_on_pauses_the_experiment_with_the_fix(tmp_path):
    """``--address`` of a port with no Ray behind it: a typed error naming the address and
    how to resume, exit 1, the experiment PAUSED (Ray's own client would end the process
    with a C++ log line and leave it ACTIVE)."""
    port = free_port()  # nothing listens on it
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    model = _model_dir(tmp_path, length=5, trials=1, env=[])
    create = _ckptstore("--registry", registry, "--storage", str(tmp_path / "ckpts"))
    create += ["experiment", "create", "exp.yaml", ".", "--engine", "ray"]
    done = _run([*create, "--address", f"127.0.0.1:{port}"], model, _driver_env(tmp_path))
    assert done.returncode == 1, (done.stdout + done.stderr)[-4000:]
    assert f"Could not connect to the Ray cluster at 127.0.0.1:{port}" in done.stderr
    assert "experiment resume 1 --engine ray" in done.stderr
    with Registry(registry) as reg:
        assert reg.list_trials(1) == [] and reg.get_experiment(1).state == "PAUSED"
