"""The experiment's trial queue on Optuna's RDB storage, without TensorFlow: slots enqueued
once, each taken by one runner, a dead runner's trial re-queued by Optuna's heartbeat and
continued as the same registry trial, retries bounded by max_restarts."""

import contextlib
import time

import optuna
import pytest

from ckptstore import errors
from ckptstore.experiment.config import parse_config
from ckptstore.experiment.optuna_queue import TrialQueue, heartbeat_settings, runners
from ckptstore.registry import Registry

pytestmark = pytest.mark.e2e  # starts trial processes

STATE = optuna.trial.TrialState


def _config(max_trials: int = 3, max_restarts: int = 5, **searcher):
    return parse_config(
        {
            "entrypoint": "python3 train.py",
            "hyperparameters": {"lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_length": {"batches": 10},
                "max_trials": max_trials,
                **searcher,
            },
            "max_restarts": max_restarts,
        }
    )


@pytest.fixture
def fast_heartbeat(monkeypatch):
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_INTERVAL", "1")
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_GRACE", "2")


def _wait_stale(queue: TrialQueue, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue.reap()
        claim = queue.pop()
        if claim is not None:
            return claim
        time.sleep(0.5)
    return None


def test_slots_are_enqueued_once_and_taken_once(registry_url, fast_heartbeat):
    with Registry(registry_url) as reg:
        exp = reg.create_experiment("q", config={})
        a = TrialQueue(_config(), exp, reg, registry_url)
        b = TrialQueue(_config(), exp, reg, registry_url)
        a.ensure_slots()
        b.ensure_slots()  # the second runner finds them enqueued
        assert len(a.study.get_trials(states=(STATE.WAITING,))) == 3
        claims = [a.pop(), b.pop(), a.pop()]
        assert b.pop() is None and a.pop() is None
        assert sorted(c.trial_id for c in claims) == [t.id for t in reg.list_trials(exp)]
        assert len({c.hparams["lr"] for c in claims}) == 3
        assert all(0.001 <= c.hparams["lr"] <= 0.1 for c in claims)
        assert a.busy()
        for i, claim in enumerate(claims):
            (a if i % 2 else b).tell(claim, float(i))
        assert not a.busy()
        complete = a.study.get_trials(states=(STATE.COMPLETE,))
        assert sorted(t.user_attrs["ckptstore_trial_id"] for t in complete) == sorted(
            c.trial_id for c in claims
        )


def test_dead_runners_trial_is_requeued_as_the_same_registry_trial(tmp_path, fast_heartbeat):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("q", config={})
        dead = TrialQueue(_config(max_trials=1), exp, reg, url)
        dead.ensure_slots()
        lost = dead.pop()
        lost.heartbeat.join()  # the runner "dies": no more heartbeats, never tells
        survivor = TrialQueue(_config(max_trials=1), exp, reg, url)
        survivor.reap()
        assert survivor.pop() is None  # not stale yet: its heartbeat is fresh
        retry = _wait_stale(survivor)
        assert retry is not None and retry.retried
        assert (retry.trial_id, retry.slot, retry.hparams) == (
            lost.trial_id,
            lost.slot,
            lost.hparams,
        )
        assert len(reg.list_trials(exp)) == 1
        assert runners(url, exp)[lost.trial_id][1]  # running again, under the survivor
        survivor.tell(retry, 0.25)
        assert survivor.study.best_value == 0.25
        assert [t.state for t in survivor.study.trials] == [STATE.FAIL, STATE.COMPLETE]


def test_retries_stop_at_max_restarts(tmp_path, fast_heartbeat, monkeypatch):
    monkeypatch.setattr("ckptstore.experiment.optuna_queue.MIN_REQUEUES", 1)
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("q", config={})
        queue = TrialQueue(_config(max_trials=1, max_restarts=0), exp, reg, url)
        queue.ensure_slots()
        first = queue.pop()
        first.heartbeat.join()
        second = _wait_stale(queue)  # retry 1 of max(max_restarts=0, MIN_REQUEUES=1)
        assert second is not None and second.trial_id == first.trial_id
        second.heartbeat.join()
        assert _wait_stale(queue, timeout=6) is None  # failed again: no retry 2
        assert reg.get_trial(first.trial_id).state == "ERROR"
        assert not queue.busy()


def test_requeue_hands_a_trial_back_at_once(tmp_path, fast_heartbeat, caplog):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("q", config={})
        queue = TrialQueue(_config(max_trials=1), exp, reg, url)
        queue.ensure_slots()
        claim = queue.pop()
        with caplog.at_level("WARNING", logger="ckptstore"):
            queue.requeue(claim)  # a runner stopping on SIGTERM
        # the log says the runner gave it back, not that it lost its heartbeat
        assert f"Trial {claim.trial_id} handed back by its runner" in caplog.text
        assert "no heartbeat" not in caplog.text
        again = queue.pop()
        assert again is not None and again.trial_id == claim.trial_id and again.retried
        queue.tell(again, None)  # failed
        assert not queue.busy()


def test_unfinished_trials_of_an_old_runner_are_requeued_on_upgrade(tmp_path, fast_heartbeat):
    """An experiment a lease-era ckptstore started: its unfinished registry trial goes back in
    the queue linked to itself, and only the missing slots are added."""
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("old", config={})
        done = reg.create_trial(experiment_id=exp, hparams={"lr": 0.01}, state="COMPLETED")
        unfinished = reg.create_trial(experiment_id=exp, hparams={"lr": 0.02})
        queue = TrialQueue(_config(max_trials=3), exp, reg, url)
        queue.ensure_slots()
        claims = [queue.pop(), queue.pop()]
        assert queue.pop() is None
        assert claims[0].trial_id == unfinished and claims[0].hparams == {"lr": 0.02}
        assert claims[1].trial_id not in (done, unfinished)
        assert len(reg.list_trials(exp)) == 3
        for claim in claims:
            queue.tell(claim, 1.0)


@pytest.mark.parametrize(
    ("interval", "grace"), [("0", None), ("x", None), ("5", "5"), ("2.5", None)]
)
def test_bad_heartbeat_settings_are_refused(monkeypatch, interval, grace):
    monkeypatch.setenv("CKPTSTORE_HEARTBEAT_INTERVAL", interval)
    if grace is not None:
        monkeypatch.setenv("CKPTSTORE_HEARTBEAT_GRACE", grace)
    with pytest.raises(errors.InvalidConfig, match="Received"):
        heartbeat_settings()


def test_processes_opening_a_new_study_database_together_all_get_it(postgres_url_factory):
    """Runners and pollers (``runners()``, ``describe``) first opening Optuna's storage in a
    new PostgreSQL database race on creating its tables and alembic version table; every one
    must get the storage (CI once saw ``runners()`` fail with "alembic_version already
    exists"). Separate processes, as in real use, started together."""
    import subprocess
    import sys

    url = postgres_url_factory()
    code = (
        "import sys; from ckptstore.experiment.optuna_queue import runners; "
        "assert runners(sys.argv[1], 1) == {}"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stderr.close()
    assert [rc for rc, _ in results] == [0] * 4, [err[-1500:] for rc, err in results if rc]


def test_a_new_registry_never_takes_a_deleted_registrys_study(tmp_path, fast_heartbeat):
    """``reg.optuna.db`` outlives a deleted ``reg.db``: the new registry's experiment 1 gets
    its own study (the old one's slots were all taken and told, so it had nothing to run)."""
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("first life", config={})
        queue = TrialQueue(_config(max_trials=1), exp, reg, url)
        queue.ensure_slots()
        queue.tell(queue.pop(), 1.0)
        assert not queue.busy()
        queue.storage.engine.dispose()
    (tmp_path / "reg.db").unlink()
    assert (tmp_path / "reg.optuna.db").exists()
    with Registry(url) as reg:
        exp2 = reg.create_experiment("second life", config={})
        assert exp2 == exp
        queue = TrialQueue(_config(max_trials=2), exp2, reg, url)
        queue.ensure_slots()
        claims = [queue.pop(), queue.pop()]
        assert None not in claims and queue.pop() is None
        assert sorted(c.trial_id for c in claims) == [t.id for t in reg.list_trials(exp2)]
        for claim in claims:
            queue.tell(claim, 0.5)
        assert runners(url, exp2, reg).keys() == {c.trial_id for c in claims}


def test_an_experiment_an_older_ckptstore_started_keeps_its_study(tmp_path):
    """A study named ``ckptstore-experiment-N`` whose trials are this experiment's registry
    trials (made before the study names carried the creation time) is still the one used."""
    from ckptstore.experiment.searcher import open_optuna_storage, resolve_study_name, study_name

    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        exp = reg.create_experiment("old", config={})
        trial = reg.create_trial(experiment_id=exp, hparams={"lr": 0.01})
        storage = open_optuna_storage(url)
        old = optuna.create_study(storage=storage, study_name=study_name(exp))
        old.add_trial(
            optuna.trial.create_trial(value=1.0, user_attrs={"ckptstore_trial_id": trial})
        )
        assert resolve_study_name(reg, exp, storage) == study_name(exp)
        other = reg.create_experiment("new", config={})
        assert resolve_study_name(reg, other, storage) == study_name(
            other, reg.get_experiment(other).created_at
        )
        storage.engine.dispose()


@contextlib.contextmanager
def _asha_queue(tmp_path, max_trials: int):
    """A new adaptive_asha experiment's queue, slots enqueued (one trial at a time, rungs at 30
    and 60 batches, smaller is better), and a function opening another runner's queue."""
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    config = _config(
        max_trials, name="adaptive_asha", max_length={"batches": 60}, divisor=2, max_rungs=2
    )
    with Registry(url) as reg:
        exp = reg.create_experiment("asha", config={})
        queue = TrialQueue(config, exp, reg, url)
        queue.ensure_slots()
        yield queue, lambda: TrialQueue(config, exp, reg, url)


def test_a_trial_paused_before_its_rung_goes_on_before_the_next_starts(tmp_path):
    """SIGTERM before the first trial's rung report, then `experiment resume`: the paused trial
    is continued before the next slot starts, so the worse trial meets the better one's value
    at the rung and stops there. (The next slot used to be taken first: it met the rung alone,
    was promoted, then the paused trial too, and both ran full length.)"""
    with _asha_queue(tmp_path, 2) as (first_run, another_runner):
        good = first_run.pop()
        first_run.requeue(good)  # paused at batch 20: checkpointed and handed back
        resumed = another_runner()
        again = resumed.pop()
        assert again.trial_id == good.trial_id and again.retried
        assert not resumed.searcher.should_prune(again.optuna_id, 30, 0.1)
        assert not resumed.searcher.should_prune(again.optuna_id, 60, 0.05)
        resumed.tell(again, 0.05)
        worse = resumed.pop()
        assert worse.trial_id != good.trial_id
        assert resumed.searcher.should_prune(worse.optuna_id, 30, 0.9)  # stopped at the rung
        resumed.tell(worse, None)
        assert not resumed.busy()


def test_a_trial_paused_after_its_rung_counts_once_there(tmp_path):
    """A trial paused after its rung report goes on as Optuna's retry copy, which keeps its
    rung value; the failed original keeps it too. ASHA must count it once: with 0.9 twice, a
    third trial's 0.5 would be in the top half of [0.1, 0.5, 0.9, 0.9] and run on; of
    [0.1, 0.5, 0.9] it is not the best of three, and stops."""
    with _asha_queue(tmp_path, 3) as (queue, _):
        paused = queue.pop()
        assert not queue.searcher.should_prune(paused.optuna_id, 30, 0.9)  # alone: promoted
        queue.requeue(paused)  # paused at batch 45
        again = queue.pop()
        assert again.trial_id == paused.trial_id
        assert not queue.searcher.should_prune(again.optuna_id, 60, 0.8)
        queue.tell(again, 0.8)
        best = queue.pop()
        assert not queue.searcher.should_prune(best.optuna_id, 30, 0.1)
        queue.tell(best, 0.05)
        middle = queue.pop()
        assert queue.searcher.should_prune(middle.optuna_id, 30, 0.5)
        queue.tell(middle, None)
        assert not queue.busy()
