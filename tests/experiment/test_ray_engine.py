"""The Ray engine on a real two-node Ray cluster on loopback (tests/servers/ray_cluster.py):
a 3-trial search placed on both nodes through ``ckptstore experiment create --engine ray``; the
second node is killed in the middle of a trial, Tune runs that trial again on the head, and it
continues from its latest ckptstore checkpoint. Then the registry, the study and the CLI show
the experiment as they show a local one. A driver killed mid-trial is continued by
``experiment resume --engine ray``. Determined's iris corpus (tests/determined_compat/corpus)
runs on Ray unchanged: ``distributed.yaml`` (launcher entrypoint, ``slots_per_trial: 2``) as one
Ray Train worker per node, resumed after its driver is lost with both workers restoring the
chief's checkpoint, and ``adaptive.yaml`` (``adaptive_asha``) stopping trials at its rung. A
TFKerasTrial with ``slots_per_trial: 2`` (the cifar10 corpus) trains on one worker per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from ckptstore.experiment.searcher import TRIAL_ATTR, optuna_storage_url, study_name
from ckptstore.registry import Registry
from tests.determined_compat.conftest import copy_corpus
from tests.experiment.waiting import wait_for
from tests.servers.ray_cluster import CLUSTER_ENV, cmdline

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


def _on_ray(cmd: list[str], env: dict[str, str], cwd: Path, address: str, *args: str) -> str:
    """``experiment ARGS --engine ray --address ADDRESS``, which must succeed; its output."""
    done = subprocess.run(
        [*cmd, "experiment", *args, "--engine", "ray", "--address", address],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def _resumed_from_checkpoint(reg: Registry, trial_id: int, killed_at: int) -> None:
    """No step up to the checkpoint trained twice; trained to the end; one continue_id."""
    steps = [m.steps_completed for m in reg.get_metrics(trial_id, "training")]
    before = [s for s in steps if s <= killed_at]
    assert len(before) == len(set(before)) and max(steps) == LENGTH
    ckpts = reg.list_checkpoints(trial_id=trial_id)
    assert {c.continue_id for c in ckpts} == {trial_id}
    assert max(c.steps_completed for c in ckpts) == LENGTH


#: Epochs of the iris distributed.yaml run (8 steps each); the driver is lost after the first.
IRIS_EPOCHS = 4  # the driver is lost after the first checkpoint; 3 more epochs to resume
IRIS_STEPS = 8  # ceil(240 / global_batch_size 32)
RESUMED = re.compile(
    r"Resumed from checkpoint ([0-9a-f-]{36}) \([^)]*\): epoch (\d+), steps_completed (\d+); "
    r"[^(]*\(worker (\d+) of (\d+)\)"
)


def _iris(tmp_path: Path, config: str, edit) -> Path:
    """A fresh copy of the iris corpus with ``config`` changed by ``edit(raw dict)``."""
    model_dir = copy_corpus("iris", tmp_path)
    path = model_dir / config
    raw = yaml.safe_load(path.read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw))
    return model_dir


def _epochs(entrypoint: str, epochs: int) -> str:
    assert "--epochs " in entrypoint, entrypoint
    return re.sub(r"--epochs \d+", f"--epochs {epochs}", entrypoint)


def _on_nodes(ray_cluster, needle: bytes) -> dict[str, set[int]]:
    """{node: pids whose command line holds ``needle``} for the nodes that run some."""
    found = {n: {p for p in ray_cluster.processes(n) if needle in cmdline(p)} for n in "hw"}
    return {n: pids for n, pids in found.items() if pids}


def test_iris_distributed_yaml_on_two_nodes_every_worker_restores(ray_cluster, tmp_path):
    """Determined's iris ``distributed.yaml`` (``python3 -m determined.launch.tensorflow --
    python3 train.py``, ``resources.slots_per_trial: 2``) on the Ray engine: two Ray Train
    TensorFlow workers, one on each node, under MultiWorkerMirroredStrategy; the chief writes
    each checkpoint once (metadata.json: two workers trained it). The driver is lost after the
    first checkpoints; ``experiment resume --engine ray`` continues the trial, and *both*
    workers restore the chief's latest checkpoint (each logs its rank and the UUID) and train
    on from its step."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    env["RAY_DEDUP_LOGS"] = "0"  # Ray would fold the workers' alike lines into one
    model_dir = _iris(
        tmp_path,
        "distributed.yaml",
        lambda raw: raw.update(entrypoint=_epochs(raw["entrypoint"], IRIS_EPOCHS)),
    )
    ray_args = ["--engine", "ray", "--address", ray_cluster.address]
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115
    driver = subprocess.Popen(
        [*cmd, "experiment", "create", "distributed.yaml", ".", *ray_args],
        cwd=model_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    reg = Registry(registry)
    try:
        nodes_seen: set[str] = set()

        def checkpointed_on_both_nodes() -> dict[str, set[int]] | None:
            workers = _on_nodes(ray_cluster, b"train.py")
            nodes_seen.update(workers)
            trials = reg.list_trials() if nodes_seen == {"h", "w"} else []
            if trials and reg.latest_checkpoint(trials[0].id) is not None:
                return workers
            return None

        workers = wait_for(checkpointed_on_both_nodes, 400, interval=0.1)
        assert workers, (nodes_seen, (tmp_path / "driver.log").read_text()[-4000:])
        # Freeze the trial where it is (no timing race with its last epochs), then lose the
        # driver: Ray's end of the driver's workers takes their trial processes with them.
        for pid in set().union(*workers.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        # Ray ends a dead driver's Tune trial, its Ray Train workers and their trial processes
        gone = wait_for(lambda: not _on_nodes(ray_cluster, b"train.py"), 60)
        assert gone, "trial processes outlived their driver"
        (trial,) = reg.list_trials(1)
        at_loss = reg.latest_checkpoint(trial.id)
        total = IRIS_EPOCHS * IRIS_STEPS
        assert 0 < at_loss.steps_completed < total
        assert trial.hparams["global_batch_size"] == 32

        output = _on_ray(cmd, env, model_dir, ray_cluster.address, "resume", "1")
        (tmp_path / "resume.log").write_text(output)
        assert reg.get_trial(trial.id).state == "COMPLETED"
        assert reg.get_experiment(1).state == "COMPLETED" and len(reg.list_trials()) == 1
        # Every worker restored the chief's checkpoint, at its step.
        restored = {int(m[4]): (m[1], int(m[3]), int(m[5])) for m in RESUMED.finditer(output)}
        expected = (at_loss.uuid, at_loss.steps_completed, 2)
        assert restored == {0: expected, 1: expected}, output[-4000:]
        # ... and trained on from there: no step up to it twice, every epoch to the end.
        steps = [m.steps_completed for m in reg.get_metrics(trial.id, "validation")]
        before = [s for s in steps if s <= at_loss.steps_completed]
        assert len(before) == len(set(before))
        assert sorted(set(steps)) == [IRIS_STEPS * (e + 1) for e in range(IRIS_EPOCHS)]
        ckpts = reg.list_checkpoints(trial_id=trial.id)
        ckpt_steps = [c.steps_completed for c in ckpts]
        assert len(ckpt_steps) == len(set(ckpt_steps)) and max(ckpt_steps) == total
        assert {json.dumps(c.metadata["distributed"]) for c in ckpts} == {'{"size": 2}'}
        assert {c.continue_id for c in ckpts} == {trial.id}
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
        reg.close()


def test_cifar_trial_on_two_slots_trains_on_both_nodes(ray_cluster, tmp_path):
    """A TFKerasTrial with ``slots_per_trial: 2`` (the cifar10 ``distributed.yaml`` shape) on
    the Ray engine: two Ray Train workers, one per node, each running the trial worker under
    MultiWorkerMirroredStrategy; the chief's checkpoints say two workers trained them."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    env["RAY_DEDUP_LOGS"] = "0"  # Ray would fold the workers' alike lines into one
    model_dir = copy_corpus("cifar10_trial", tmp_path)
    output = _on_ray(cmd, env, model_dir, ray_cluster.address, "create", "distributed.yaml", ".")
    # Ray prefixes a worker's lines with its node's address (none for the driver's node, the
    # head): one rank on each node.
    found = re.findall(
        r"RayTrainWorker pid=\d+(, ip=[\d.]+)?\).*Trial 1: rank (\d) of 2 workers", output
    )
    nodes, ranks = {node for node, _ in found}, {rank for _, rank in found}
    assert len(found) == 2 and nodes == {"", ", ip=127.0.0.3"} and ranks == {"0", "1"}, found
    with Registry(registry) as reg:
        (trial,) = reg.list_trials(1)
        assert trial.state == "COMPLETED"
        ckpts = reg.list_checkpoints(trial_id=trial.id)
        assert max(c.steps_completed for c in ckpts) == 24
        assert {c.metadata["distributed"]["size"] for c in ckpts} == {2}
        assert {m.steps_completed for m in reg.get_metrics(trial.id, "validation")} == {8, 16, 24}


def _study_name(registry: str) -> str:
    """Experiment 1's Optuna study (named with its creation time in the registry)."""
    with Registry(registry) as reg:
        return study_name(1, reg.get_experiment(1).created_at)


def test_iris_adaptive_asha_prunes_at_the_rung_on_ray(ray_cluster, tmp_path):
    """Determined's iris ``adaptive.yaml`` (``adaptive_asha``, 4 trials, max_length 60 batches,
    divisor 2: one rung at 30) on the Ray engine, two trials at a time (one per node): the
    trial processes ask the experiment's Optuna pruner as locally, so the trials with the
    useless learning rate reported after a good one are stopped at the rung (they checkpoint
    there and end COMPLETED, Optuna PRUNED) and the rest train to 60 batches."""
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    cmd, env = _cli(tmp_path, registry)
    model_dir = _iris(
        tmp_path, "adaptive.yaml", lambda raw: raw["searcher"].update(max_concurrent_trials=2)
    )
    _on_ray(cmd, env, model_dir, ray_cluster.address, "create", "adaptive.yaml", ".")
    with Registry(registry) as reg:
        trials = reg.list_trials(1)
        assert len(trials) == 4 and all(t.state == "COMPLETED" for t in trials)
        trained = {t.id: reg.latest_checkpoint(t.id).steps_completed for t in trials}
        lr = {t.id: t.hparams["learning_rate"] for t in trials}
    stopped = {t for t, steps in trained.items() if steps < 60}
    # The last useless trial reaches the rung after two good ones at least: it is stopped.
    assert any(lr[t] < 1e-6 for t in stopped), (trained, lr)
    assert all(trained[t] == 30 for t in stopped), trained  # at the rung
    assert all(trained[t] == 60 for t in set(trained) - stopped), trained  # the rest ran on
    url, kwargs = optuna_storage_url(registry)
    study = optuna.load_study(
        study_name=_study_name(registry),
        storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs),
    )
    states = {t.user_attrs[TRIAL_ATTR]: t.state.name for t in study.trials}
    assert states == {t: "PRUNED" if t in stopped else "COMPLETE" for t in trained}, states


def test_search_on_two_nodes_survives_a_lost_node(ray_cluster, tmp_path):
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
            study_name=_study_name(registry),
            storage=optuna.storages.RDBStorage(url, engine_kwargs=kwargs),
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


def test_lost_driver_is_continued_by_resume_on_ray(ray_cluster, tmp_path):
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


def test_a_failed_trial_on_ray_shows_its_error_lines(ray_cluster, tmp_path):
    """The trial's output on a Ray node is stored like a local runner's (logs/<trial id>/), so
    the driver's failure message shows the error line, not "(no output)"."""
    model_dir = copy_corpus("failing", tmp_path)
    (model_dir / "const.yaml").write_text(
        (model_dir / "const.yaml").read_text() + "max_restarts: 0\n"
    )
    cmd, env = _cli(tmp_path, f"sqlite:///{tmp_path / 'reg.db'}")
    done = subprocess.run(
        [*cmd, "experiment", "create", "const.yaml", ".", "--engine", "ray"]
        + ["--address", ray_cluster.address],
        cwd=model_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    error = "FileNotFoundError: training data not found: /data/missing.csv"
    assert f"| {error}" in done.stderr and "(no output)" not in done.stderr, done.stderr[-4000:]


@pytest.mark.parametrize(
    ("resources", "error", "match"),
    [({"slots_per_trial": 0}, "InvalidConfig", "slots_per_trial")],
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
