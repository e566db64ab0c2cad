"""Runner identities, dead-runner detection, the lease heartbeat, and a runner taking over a
trial whose runner on another machine stopped renewing its lease."""

import socket
import subprocess
import sys
import textwrap

import pytest

from ckptstore import errors
from ckptstore.keras_io.experiment import create_experiment, describe_experiment
from ckptstore.keras_io.experiment.leasing import (
    LeaseKeeper,
    lease_seconds_from_env,
    owner_is_dead_here,
    runner_identity,
)
from ckptstore.keras_io.experiment.runner import resume_experiment
from ckptstore.registry import Registry


def test_runner_identity_and_dead_owners():
    me = runner_identity()
    host, pid, start, token = me.rsplit(":", 3)
    assert host == socket.gethostname() and pid == str(__import__("os").getpid())
    assert start != "0" and token and runner_identity() != me
    assert not owner_is_dead_here(me)

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(f"/proc/{child.pid}/stat") as f:
            child_start = f.read().rsplit(")", 1)[1].split()[19]
        alive = f"{host}:{child.pid}:{child_start}:abcd"
        assert not owner_is_dead_here(alive)
        # the same pid with another start time is a later process: the owner is gone
        assert owner_is_dead_here(f"{host}:{child.pid}:{int(child_start) - 1}:abcd")
        child.kill()
        child.wait()
        assert owner_is_dead_here(alive)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # another machine's runner, or a name not made by runner_identity: never judged dead here
    assert not owner_is_dead_here(f"not-{host}:{child.pid}:{child_start}:abcd")
    assert not owner_is_dead_here("someone")


def test_lease_seconds_from_env(monkeypatch):
    monkeypatch.delenv("CKPTSTORE_TRIAL_LEASE_SECONDS", raising=False)
    assert lease_seconds_from_env() == 60
    monkeypatch.setenv("CKPTSTORE_TRIAL_LEASE_SECONDS", "2.5")
    assert lease_seconds_from_env() == 2.5
    for bad in ("0", "-3", "soon", "nan"):
        monkeypatch.setenv("CKPTSTORE_TRIAL_LEASE_SECONDS", bad)
        with pytest.raises(errors.InvalidConfig, match="CKPTSTORE_TRIAL_LEASE_SECONDS"):
            lease_seconds_from_env()


def test_lease_keeper_renews_notices_a_lost_lease_and_releases(tmp_path):
    with Registry(f"sqlite:///{tmp_path / 'reg.db'}") as registry:
        exp = registry.create_experiment("keeper")
        kept, stolen = (registry.create_trial(experiment_id=exp) for _ in range(2))
        keeper = LeaseKeeper(registry, runner_identity(), 30)
        for trial_id in (kept, stolen):
            assert registry.claim_trial(trial_id, keeper.owner, 30)
            keeper.add(trial_id)
        before = registry.get_trial_lease(kept).expires_at
        assert registry.claim_trial(stolen, "other", 30, replace_owner=keeper.owner)
        keeper.renew_all()
        assert registry.get_trial_lease(kept).expires_at > before
        assert keeper.lost() == {stolen} and keeper.held() == {kept}
        keeper.release(stolen)  # forgets it without touching the new owner's lease
        assert registry.get_trial_lease(stolen).held
        assert registry.get_trial_lease(stolen).owner == "other"
        keeper.start()
        keeper.stop()  # releases what it still holds
        lease = registry.get_trial_lease(kept)
        assert lease.owner == keeper.owner and lease.released_at is not None


TRAIN_PY = """
import ckptstore as det

with det.core.init() as core_context:
    core_context.train.report_validation_metrics(1, {"val_loss": 1.0})
"""


def test_runner_takes_over_a_trial_whose_lease_expired(tmp_path, monkeypatch):
    """A trial claimed by a runner on another machine that stopped renewing (it died): a runner
    here waits for the lease to expire, then runs the trial itself."""
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    storage, registry_url = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    raw = {
        "hyperparameters": {"units": 3},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "entrypoint": f"{sys.executable} train.py",
    }
    exp = create_experiment(raw, tmp_path, storage=storage, registry=registry_url, run=False)
    elsewhere = "another-machine:4242:1:abcd"
    with Registry(registry_url) as registry:
        trial = registry.create_claimed_trial(
            exp, hparams={"units": 3}, max_trials=1, owner=elsewhere, lease_seconds=3
        )
        expires = registry.get_trial_lease(trial).expires_at
        resume_experiment(exp, registry=registry_url)
        lease = registry.get_trial_lease(trial)
        assert lease.claims == 2 and lease.owner != elsewhere and lease.released_at is not None
        assert lease.acquired_at >= expires  # not before the other runner's lease ran out
        (row,) = registry.get_metrics(trial, "validation")
        assert row.reported_at >= expires
        assert len(registry.list_trials(exp)) == 1
    info = describe_experiment(exp, registry=registry_url)
    assert info["state"] == "COMPLETED" and info["trials"][0]["state"] == "COMPLETED"
