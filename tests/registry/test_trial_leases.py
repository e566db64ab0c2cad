"""Trial leases on SQLite and PostgreSQL: one winner per claim race (real processes), renew,
release, expiry and takeover, and max_trials kept when runners race to create trials."""

from __future__ import annotations

import multiprocessing
import time
import traceback

import pytest

from ckptstore import errors
from ckptstore.registry import Registry

PROCESSES = 4


def _claimer(url: str, index: int, trial_ids: list[int], barrier, results) -> None:
    try:
        with Registry(url) as registry:
            barrier.wait(timeout=120)
            won = [t for t in trial_ids if registry.claim_trial(t, f"runner-{index}", 60)]
        results.put((index, "ok", won))
    except BaseException:  # noqa: BLE001 - reported to the parent test
        results.put((index, "error", traceback.format_exc()))


def _creator(url: str, index: int, experiment_id: int, barrier, results) -> None:
    try:
        with Registry(url) as registry:
            barrier.wait(timeout=120)
            made = []
            for j in range(3):
                trial_id = registry.create_claimed_trial(
                    experiment_id,
                    hparams={"runner": index, "j": j},
                    max_trials=5,
                    owner=f"runner-{index}",
                    lease_seconds=60,
                )
                if trial_id is not None:
                    made.append(trial_id)
        results.put((index, "ok", made))
    except BaseException:  # noqa: BLE001 - reported to the parent test
        results.put((index, "error", traceback.format_exc()))


def _race(target, *args) -> dict[int, list[int]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(*args[:1], i, *args[1:], barrier, results))
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    failed = [r for r in out if r[1] != "ok"]
    assert not failed, failed[0][2]
    return {index: value for index, _, value in out}


def test_processes_racing_for_trials_each_get_a_trial_exactly_once(registry_url):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("race")
        trial_ids = [registry.create_trial(experiment_id=exp) for _ in range(8)]
    won = _race(_claimer, registry_url, trial_ids)
    every_win = [t for wins in won.values() for t in wins]
    assert sorted(every_win) == trial_ids  # each trial claimed by exactly one process
    with Registry(registry_url) as registry:
        for lease in registry.list_trial_leases(exp):
            assert lease.owner == f"runner-{next(i for i, w in won.items() if lease.trial_id in w)}"
            assert lease.held and lease.claims == 1


def test_racing_creators_never_exceed_max_trials(registry_url):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("create race")
    made = _race(_creator, registry_url, exp)
    every = [t for ids in made.values() for t in ids]
    assert len(every) == 5 and len(set(every)) == 5
    with Registry(registry_url) as registry:
        trials = registry.list_trials(exp)
        assert sorted(t.id for t in trials) == sorted(every)
        leases = {lease.trial_id: lease for lease in registry.list_trial_leases(exp)}
        for index, ids in made.items():
            for trial_id in ids:
                assert leases[trial_id].owner == f"runner-{index}" and leases[trial_id].held
                assert registry.get_trial(trial_id).hparams["runner"] == index


def test_claim_renew_release_and_expiry(registry_url):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("lease")
        trial = registry.create_trial(experiment_id=exp)
        assert registry.get_trial_lease(trial) is None
        assert registry.claim_trial(trial, "a", 60)
        assert not registry.claim_trial(trial, "b", 60)  # held by a
        assert registry.claim_trial(trial, "a", 60)  # a renews by claiming again
        assert registry.renew_trial_lease(trial, "a", 60)
        assert not registry.renew_trial_lease(trial, "b", 60)
        assert not registry.release_trial(trial, "b")
        lease = registry.get_trial_lease(trial)
        assert lease.owner == "a" and lease.held and lease.claims == 1

        # a known-dead owner's live lease can be taken over
        assert registry.claim_trial(trial, "b", 60, replace_owner="a")
        assert not registry.renew_trial_lease(trial, "a", 60)  # a lost it
        assert registry.release_trial(trial, "b")
        lease = registry.get_trial_lease(trial)
        assert lease.owner == "b" and not lease.held and lease.released_at is not None
        assert lease.claims == 2
        assert not registry.renew_trial_lease(trial, "b", 60)  # released: nothing to renew

        # released: anyone claims at once; a lease left to expire is taken after it expires
        assert registry.claim_trial(trial, "c", 0.2)
        assert not registry.claim_trial(trial, "d", 60)
        time.sleep(1.0)
        assert registry.get_trial_lease(trial).expired
        assert registry.claim_trial(trial, "d", 60)
        assert not registry.renew_trial_lease(trial, "c", 60)
        assert registry.get_trial_lease(trial).claims == 4

        # finished trials are never claimed
        registry.release_trial(trial, "d")
        registry.set_trial_state(trial, "COMPLETED")
        assert not registry.claim_trial(trial, "e", 60)
        assert registry.get_trial_lease(trial).owner == "d"


def test_create_claimed_trial_counts_existing_trials(registry_url):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("count")
        registry.create_trial(experiment_id=exp)
        other = registry.create_experiment("other")
        registry.create_trial(experiment_id=other)
        first = registry.create_claimed_trial(
            exp, hparams={"x": 1}, max_trials=2, owner="a", lease_seconds=30
        )
        assert first is not None and registry.get_trial(first).hparams == {"x": 1}
        assert registry.get_trial_lease(first).owner == "a"
        assert (
            registry.create_claimed_trial(
                exp, hparams={}, max_trials=2, owner="a", lease_seconds=30
            )
            is None
        )
        assert [lease.trial_id for lease in registry.list_trial_leases(exp)] == [first]

        calls = []

        def propose():
            calls.append(1)
            return {"x": len(calls)}

        third = registry.create_claimed_trial(
            exp, hparams=propose, max_trials=3, owner="b", lease_seconds=30
        )
        assert registry.get_trial(third).hparams == {"x": 1}
        full = registry.create_claimed_trial(
            exp, hparams=propose, max_trials=3, owner="b", lease_seconds=30
        )
        assert full is None and len(calls) == 1  # asked only when there was room


def test_bad_lease_arguments(registry_url):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("bad")
        trial = registry.create_trial(experiment_id=exp)
        with pytest.raises(errors.TrialNotFound):
            registry.claim_trial(trial + 100, "a", 60)
        with pytest.raises(errors.InvalidConfig, match="lease_seconds"):
            registry.claim_trial(trial, "a", 0)
        with pytest.raises(errors.InvalidConfig, match="owner"):
            registry.claim_trial(trial, "", 60)
        with pytest.raises(errors.ExperimentNotFound):
            registry.create_claimed_trial(
                exp + 100, hparams={}, max_trials=3, owner="a", lease_seconds=60
            )
        with pytest.raises(errors.InvalidConfig, match="max_trials"):
            registry.create_claimed_trial(
                exp, hparams={}, max_trials=-1, owner="a", lease_seconds=60
            )
