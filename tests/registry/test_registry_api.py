"""Registry API on SQLite and PostgreSQL (real server): experiments, trials, metrics, checkpoints."""

from __future__ import annotations

import datetime as dt

import pytest

from ckptstore import errors
from ckptstore.checkpointing.index import CheckpointIndex, CheckpointRecord
from ckptstore.registry import Checkpoint, Registry
from ckptstore.registry.entities import LOST, LOST_AFTER_SECONDS, trial_status


@pytest.fixture
def registry(registry_url):
    with Registry(registry_url) as reg:
        yield reg


def _record(uuid, trial_id=1, steps=10, state="COMMITTED", **kw) -> CheckpointRecord:
    return CheckpointRecord(uuid=uuid, trial_id=trial_id, steps_completed=steps, state=state, **kw)


def test_registry_satisfies_checkpoint_index_protocol(registry):
    assert isinstance(registry, CheckpointIndex)


def test_experiments_roundtrip_and_state(registry):
    exp = registry.create_experiment(
        "mnist", config={"searcher": {"metric": "acc"}}, description="d"
    )
    got = registry.get_experiment(exp)
    assert (got.id, got.name, got.config, got.description, got.state) == (
        exp,
        "mnist",
        {"searcher": {"metric": "acc"}},
        "d",
        "ACTIVE",
    )
    assert got.created_at.tzinfo is dt.timezone.utc
    registry.set_experiment_state(exp, "COMPLETED")
    assert registry.get_experiment(exp).state == "COMPLETED"
    other = registry.create_experiment()
    assert [e.id for e in registry.list_experiments()] == [exp, other]
    with pytest.raises(errors.ExperimentNotFound, match="999"):
        registry.get_experiment(999)
    with pytest.raises(errors.ExperimentNotFound):
        registry.set_experiment_state(999, "ACTIVE")
    with pytest.raises(errors.InvalidConfig, match="RUNNING"):
        registry.set_experiment_state(exp, "RUNNING")


def test_trials_create_ensure_get_list_state(registry):
    exp = registry.create_experiment("e")
    t1 = registry.create_trial(experiment_id=exp, hparams={"lr": 0.1})
    t2 = registry.create_trial(trial_id=40)
    assert t2 == 40
    t3 = registry.create_trial()  # auto ids continue after explicit ones
    assert t3 > 40
    trial = registry.get_trial(t1)
    assert (trial.id, trial.experiment_id, trial.hparams, trial.state) == (
        t1,
        exp,
        {"lr": 0.1},
        "ACTIVE",
    )
    assert [t.id for t in registry.list_trials()] == [t1, 40, t3]
    assert [t.id for t in registry.list_trials(experiment_id=exp)] == [t1]

    ensured = registry.ensure_trial(77, experiment_id=5, hparams={"x": 1})
    assert (ensured.id, ensured.experiment_id, ensured.hparams) == (77, 5, {"x": 1})
    assert registry.get_experiment(5).id == 5  # created on the way
    again = registry.ensure_trial(77, hparams={"x": 2})
    assert again.hparams == {"x": 1}  # existing trial keeps its values

    for state in ("PAUSED", "COMPLETED", "ERROR", "CANCELED", "ACTIVE"):
        registry.set_trial_state(t1, state)
        assert registry.get_trial(t1).state == state
    with pytest.raises(errors.TrialNotFound, match="12345"):
        registry.get_trial(12345)
    with pytest.raises(errors.TrialNotFound):
        registry.set_trial_state(12345, "ERROR")
    with pytest.raises(errors.InvalidConfig):
        registry.set_trial_state(t1, "DONE")
    with pytest.raises(errors.ExperimentNotFound):
        registry.create_trial(experiment_id=999)
    with pytest.raises(errors.RegistryError, match="already exists"):
        registry.create_trial(trial_id=40)
    with pytest.raises(errors.InvalidConfig):
        registry.create_trial(trial_id=0)


def test_metrics_ordered_by_steps_and_grouped(registry):
    trial = registry.create_trial()
    registry.report_metrics(trial, "training", 200, {"loss": 0.2})
    registry.report_metrics(trial, "validation", 100, {"val_loss": 0.5})
    registry.report_metrics(trial, "training", 100, {"loss": 0.4})
    rows = registry.get_metrics(trial)
    # by steps, then in the order reported
    assert [(r.group, r.steps_completed) for r in rows] == [
        ("validation", 100),
        ("training", 100),
        ("training", 200),
    ]
    training = registry.get_metrics(trial, group="training")
    assert [(r.steps_completed, r.metrics) for r in training] == [
        (100, {"loss": 0.4}),
        (200, {"loss": 0.2}),
    ]
    assert training[0].trial_id == trial and training[0].reported_at.tzinfo is not None
    with pytest.raises(errors.TrialNotFound):
        registry.report_metrics(999, "training", 1, {"loss": 1})
    with pytest.raises(errors.TrialNotFound):
        registry.get_metrics(999)
    with pytest.raises(errors.InvalidConfig, match="group"):
        registry.report_metrics(trial, "", 1, {})
    with pytest.raises(errors.InvalidConfig, match="steps_completed"):
        registry.report_metrics(trial, "training", -1, {})


def test_record_checkpoint_roundtrip_creates_trial_and_experiment(registry):
    created = dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
    record = CheckpointRecord(
        uuid="c-1",
        trial_id=3,
        experiment_id=8,
        steps_completed=120,
        continue_id=4,
        state="COMMITTED",
        metadata={"epoch": 2, "framework": "keras"},
        metrics={"validation_metrics": {"val_loss": 0.25}},
        resources={"model.keras": 1234, "metadata.json": 20},
        storage_url="s3://bucket/prefix",
        created_at=created,
    )
    registry.record_checkpoint(record)
    ckpt = registry.get_checkpoint("c-1")
    assert isinstance(ckpt, Checkpoint)
    assert ckpt.to_record() == record
    assert registry.get_trial(3).experiment_id == 8
    assert registry.get_experiment(8).state == "ACTIVE"
    # upsert by uuid keeps created_at when the update gives none
    registry.record_checkpoint(_record("c-1", trial_id=3, steps=121, experiment_id=8))
    again = registry.get_checkpoint("c-1")
    assert again.steps_completed == 121 and again.created_at == created
    assert len(registry.list_checkpoints()) == 1


def test_record_checkpoint_rejects_bad_records(registry):
    with pytest.raises(errors.InvalidConfig, match="uuid"):
        registry.record_checkpoint(CheckpointRecord(uuid=""))
    with pytest.raises(errors.InvalidConfig, match="state"):
        registry.record_checkpoint(CheckpointRecord(uuid="x", state="DONE"))
    with pytest.raises(errors.InvalidConfig, match="trial_id"):
        registry.record_checkpoint(CheckpointRecord(uuid="x", trial_id=-3))
    with pytest.raises(errors.InvalidConfig):
        registry.record_checkpoint({"uuid": "x"})  # type: ignore[arg-type]


def test_set_state_records_and_latest(registry):
    registry.record_checkpoint(_record("a", steps=10))
    registry.record_checkpoint(_record("b", steps=30))
    registry.record_checkpoint(_record("c", steps=20))
    registry.record_checkpoint(_record("pending", steps=50, state="PENDING"))
    registry.record_checkpoint(_record("other", trial_id=2, steps=99))
    assert registry.latest_checkpoint(1).uuid == "b"
    registry.set_checkpoint_state("b", "PARTIALLY_DELETED", resources={"metadata.json": 5})
    latest = registry.latest_checkpoint(1)
    assert latest.uuid == "b" and latest.resources == {"metadata.json": 5}
    registry.set_checkpoint_state("b", "DELETED")
    assert registry.latest_checkpoint(1).uuid == "c"
    assert registry.latest_checkpoint(12345) is None

    records = registry.checkpoint_records(trial_id=1)
    assert [r.uuid for r in records] == ["a", "c"]
    assert all(isinstance(r, CheckpointRecord) for r in records)
    assert [
        r.uuid for r in registry.checkpoint_records(trial_id=1, states=("DELETED", "PENDING"))
    ] == [
        "b",
        "pending",
    ]
    assert [c.uuid for c in registry.list_checkpoints(trial_id=1)] == ["a", "c", "b", "pending"]
    assert [c.uuid for c in registry.list_checkpoints(states=["COMMITTED"])] == ["a", "c", "other"]
    with pytest.raises(errors.CheckpointNotFound, match="nope"):
        registry.set_checkpoint_state("nope", "DELETED")
    with pytest.raises(errors.CheckpointNotFound, match="nope"):
        registry.get_checkpoint("nope")
    with pytest.raises(errors.InvalidConfig):
        registry.set_checkpoint_state("a", "GONE")


def test_latest_breaks_step_ties_by_created_at(registry):
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    registry.record_checkpoint(_record("new", steps=10, created_at=t0 + dt.timedelta(seconds=5)))
    registry.record_checkpoint(_record("old", steps=10, created_at=t0))
    assert registry.latest_checkpoint(1).uuid == "new"
    assert [r.uuid for r in registry.checkpoint_records(trial_id=1)] == ["old", "new"]


def test_best_checkpoint_nested_flat_and_config_defaults(registry):
    exp = registry.create_experiment(
        config={"searcher": {"metric": "acc", "smaller_is_better": False}}
    )
    t1 = registry.create_trial(experiment_id=exp)
    t2 = registry.create_trial(experiment_id=exp)

    def add(uuid, trial, steps, metrics, state="COMMITTED"):
        registry.record_checkpoint(
            CheckpointRecord(
                uuid=uuid,
                trial_id=trial,
                experiment_id=exp,
                steps_completed=steps,
                state=state,
                metrics=metrics,
            )
        )

    add("n1", t1, 1, {"validation_metrics": {"val_loss": 0.5, "acc": 0.7}})
    add("f1", t1, 2, {"val_loss": 0.3, "acc": 0.6})
    add("t2a", t2, 1, {"validation_metrics": {"val_loss": 0.1, "acc": 0.9}}, state="DELETED")
    add("t2b", t2, 2, {"training_metrics": {"val_loss": 0.4, "acc": 0.8}})
    add("none", t2, 3, {"something": 1})

    assert registry.best_checkpoint(trial_id=t1, metric="val_loss").uuid == "f1"
    assert (
        registry.best_checkpoint(trial_id=t1, metric="val_loss", smaller_is_better=False).uuid
        == "n1"
    )
    # defaults from the experiment's searcher config: acc, larger is better; DELETED skipped
    assert registry.best_checkpoint(experiment_id=exp).uuid == "t2b"
    assert registry.best_checkpoint(trial_id=t1).uuid == "n1"
    assert registry.best_checkpoint(trial_id=t1, metric="missing") is None
    assert registry.best_checkpoint(metric="val_loss").uuid == "f1"  # whole registry


def test_best_checkpoint_ties_go_to_most_recent(registry):
    registry.record_checkpoint(_record("early", steps=1, metrics={"val_loss": 0.2}))
    registry.record_checkpoint(_record("late", steps=2, metrics={"val_loss": 0.2}))
    assert registry.best_checkpoint(trial_id=1, metric="val_loss").uuid == "late"


def test_closed_registry_refuses_work(registry_url):
    reg = Registry(registry_url)
    reg.close()
    reg.close()  # idempotent
    with pytest.raises(errors.RegistryError, match="closed"):
        reg.list_trials()


def test_lookup_metric_forms():
    from ckptstore.registry import lookup_metric

    assert lookup_metric({"val_loss": 1}, "val_loss") == 1.0
    assert lookup_metric({"validation_metrics": {"val_loss": 2.5}}, "val_loss") == 2.5
    assert lookup_metric({"val_loss": 1, "validation_metrics": {"val_loss": 2}}, "val_loss") == 1.0
    assert lookup_metric({"training_metrics": {"loss": 3}}, "loss") == 3.0
    assert lookup_metric({"val_loss": True}, "val_loss") is None
    assert lookup_metric({"val_loss": float("nan")}, "val_loss") is None
    assert lookup_metric({"val_loss": "0.1"}, "val_loss") is None
    assert lookup_metric({}, "val_loss") is None


def test_trial_status_is_lost_only_for_an_active_trial_without_recent_heartbeats():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    old = now - dt.timedelta(seconds=LOST_AFTER_SECONDS + 1)
    recent = now - dt.timedelta(seconds=LOST_AFTER_SECONDS - 1)
    assert trial_status("ACTIVE", old, now) == LOST
    assert trial_status("ACTIVE", recent, now) == "ACTIVE"
    assert trial_status("ACTIVE", None, now) == "ACTIVE"  # no heartbeat yet says nothing
    assert trial_status("COMPLETED", old, now) == "COMPLETED"
