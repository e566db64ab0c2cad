"""One odd value never takes down the rest, and fails the same way on SQLite and PostgreSQL:
``reindex`` leaves out a checkpoint whose ``metadata.json`` has an odd ``trial_id`` and indexes
the others; ids and steps beyond the columns' range, NUL characters and lone surrogates are an
``InvalidConfig`` before the database; NaN/inf in JSON become null on both databases; the
experiments page renders every row when one experiment's config is odd."""

from __future__ import annotations

import json
import math

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.cli.main import cli
from ckptstore.registry import Registry, schema
from ckptstore.storage_backends import open_storage
from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings
from tests._helpers.trees import make_tree


@pytest.mark.parametrize("trial_id", ["abc", 2**70, 2**31, 0, True, 1.5, [1]])
def test_reindex_leaves_out_a_bad_record_and_indexes_the_others(registry_url, tmp_path, trial_id):
    store = str(tmp_path / "store")
    src = make_tree(str(tmp_path / "src"), {"w.bin": b"w" * 100})
    with CheckpointContext(store) as ctx:  # no index: nothing checks trial_id at save time
        good = [ctx.upload(src, {"trial_id": t, "steps_completed": t}) for t in (1, 2, 3)]
        bad = ctx.upload(src, {"trial_id": trial_id, "steps_completed": 4})
    with Registry(registry_url) as registry, open_storage(store) as storage:
        skipped: dict[str, str] = {}
        assert registry.reindex(storage, skipped=skipped) == 3
        assert list(skipped) == [bad]
        assert "trial_id" in skipped[bad]
        assert sorted(c.uuid for c in registry.list_checkpoints()) == sorted(good)
        assert registry.reindex(storage) == 3  # without the report argument too
    result = CliRunner().invoke(
        cli, ["--storage", store, "--registry", registry_url, "reindex", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["checkpoints"] == 3 and list(report["skipped"]) == [bad]


def test_reindex_writes_records_one_by_one_when_a_batch_is_refused(registry_url, tmp_path):
    """A record that passes the record checks but that a column refuses (a metadata uuid
    longer than the uuid column) costs only itself, not the 2 others of its batch."""
    store = str(tmp_path / "store")
    src = make_tree(str(tmp_path / "src"), {"w.bin": b"w"})
    with CheckpointContext(store) as ctx:
        good = [ctx.upload(src, {"trial_id": 1, "steps_completed": s}) for s in (1, 2)]
        ctx.upload(src, {"trial_id": 1, "steps_completed": 3, "uuid": "u" * 100})
    odd = next(u for u in scan.list_committed(open_storage(store)) if u not in good)
    # build_metadata drops a caller's "uuid"; write one as a foreign tool might.
    meta_path = tmp_path / "store" / odd / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta_path.chmod(0o644)
    meta_path.write_text(json.dumps({**meta, "uuid": "u" * 100}))
    with Registry(registry_url) as registry, open_storage(store) as storage:
        skipped: dict[str, str] = {}
        assert registry.reindex(storage, skipped=skipped) == 2
        assert list(skipped) == ["u" * 100] and "longer than" in skipped["u" * 100]
        assert sorted(c.uuid for c in registry.list_checkpoints()) == sorted(good)


RECORD = dict(uuid="u1", trial_id=None, experiment_id=None, steps_completed=1)
#: (call, words of the InvalidConfig) that must fail identically on SQLite and PostgreSQL.
REFUSED = {
    "trial-id-2**31": (lambda r: r.create_trial(trial_id=2**31), "from 1 to 2147483647"),
    "trial-id-2**70": (lambda r: r.create_trial(trial_id=2**70), "from 1 to 2147483647"),
    "get-trial-2**70": (lambda r: r.get_trial(2**70), "out of range"),
    "get-experiment-2**40": (lambda r: r.get_experiment(2**40), "out of range"),
    "steps-2**64": (
        lambda r: r.report_metrics(r.create_trial(), "training", 2**64, {"a": 1}),
        "steps_completed must be an integer from 0",
    ),
    "checkpoint-trial-2**40": (
        lambda r: r.record_checkpoint(CheckpointRecord(**{**RECORD, "trial_id": 2**40})),
        "trial_id must be",
    ),
    "checkpoint-steps-2**63": (
        lambda r: r.record_checkpoint(CheckpointRecord(**{**RECORD, "steps_completed": 2**63})),
        "steps_completed must be",
    ),
    "description-surrogate": (
        lambda r: r.create_experiment("x", description="a\ud800"),
        "lone surrogate",
    ),
    "update-description-surrogate": (
        lambda r: r.update_experiment(r.create_experiment("x"), description="\udfff"),
        "lone surrogate",
    ),
    "model-description-surrogate": (
        lambda r: r.create_model("m", description="\ud800"),
        "lone surrogate",
    ),
    "config-surrogate": (
        lambda r: r.create_experiment("x", config={"k": "\ud800"}),
        "not valid Unicode",
    ),
    "experiment-name-nul": (lambda r: r.create_experiment("a\x00b"), "NUL"),
    "model-name-nul": (lambda r: r.create_model("m\x00"), "NUL"),
    "metric-group-nul": (
        lambda r: r.report_metrics(r.create_trial(), "train\x00", 1, {"a": 1}),
        "NUL",
    ),
    "experiment-name-too-long": (lambda r: r.create_experiment("n" * 257), "at most 256"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_odd_values_are_refused_the_same_on_both_databases(registry_url, name):
    call, words = REFUSED[name]
    with Registry(registry_url) as registry:
        with pytest.raises(errors.InvalidConfig, match=words):
            call(registry)
        # The registry still works after the refusal.
        assert registry.create_experiment("fine") >= 1


def test_nan_and_inf_in_configs_and_model_metadata_become_null_on_both(registry_url):
    odd = {"a": math.nan, "b": [math.inf, -math.inf], "c": {"d": 1.5}}
    clean = {"a": None, "b": [None, None], "c": {"d": 1.5}}
    with Registry(registry_url) as registry:
        exp = registry.create_experiment("x", config=odd)
        assert registry.get_experiment(exp).config == clean
        assert registry.update_experiment(exp, config={"e": math.nan}).config == {"e": None}
        model = registry.create_model("m", metadata=odd)
        assert registry.get_model("m").metadata == clean
        model.add_metadata({"f": math.inf})
        assert registry.get_model("m").metadata == {**clean, "f": None}


def test_job_output_with_nul_bytes_is_kept_readable(registry_url):
    with Registry(registry_url) as registry:
        job = registry.create_job({}, "/m", "/s")
        registry.set_job_state(job, "COMPLETED", exit_code=0, log="a\x00b\ud800c")
        assert registry.get_job(job).log == "a\ufffdb?c"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.one_of(st.integers(-(2**80), 2**80), st.sampled_from([2**31 - 1, 2**31, -1])))
def test_ids_either_work_or_are_refused_before_the_database(registry_url, value):
    with Registry(registry_url) as registry:
        try:
            trial = registry.get_trial(value)
        except errors.TrialNotFound:
            assert -(2**31) <= value <= schema.INT_MAX
        except errors.InvalidConfig as exc:
            assert not -(2**31) <= value <= schema.INT_MAX
            assert str(value) in str(exc)
        else:
            assert trial.id == value


def _insert_raw(registry: Registry, table: str, **values: object) -> int:
    """A row as written before the registry checked values (or by another tool): plain SQL,
    past the column types' checks. JSON values are given as JSON text."""
    if table != "metrics":
        values.setdefault("created_at", schema.utcnow())
        values.setdefault("updated_at", schema.utcnow())
    names = ", ".join(f'"{k}"' for k in values)
    marks = ", ".join(f":{k}" for k in values)
    with registry._db.engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({marks})"), values)
        return conn.execute(sa.text(f"SELECT MAX(id) FROM {table}")).scalar_one()


def test_one_odd_experiment_does_not_break_the_experiments_page(registry_url, tmp_path):
    nul = json.dumps({"searcher": {"metric": "a\x00b"}})
    with Registry(registry_url) as registry:
        # New NULs are refused at write time, on both databases ...
        with pytest.raises(errors.InvalidConfig, match="NUL"):
            registry.create_experiment("x", config=json.loads(nul))
        with pytest.raises(errors.InvalidConfig, match="NUL"):
            registry.report_metrics(registry.create_trial(), "validation", 1, {"a\x00b": 1})
        names = []
        for i in range(3):
            exp = registry.create_experiment(f"exp-{i}", config={"searcher": {"metric": "m"}})
            trial = registry.create_trial(experiment_id=exp)
            registry.report_metrics(trial, "validation", 1, {"m": 0.25 + i})
            names.append(f"exp-{i}")
        # ... and rows that hold one already (or other odd configs) still render.
        odd = _insert_raw(registry, "experiments", name="odd-nul", config=nul, state="ACTIVE")
        trial = _insert_raw(registry, "trials", experiment_id=odd, hparams="{}", state="ACTIVE")
        _insert_raw(
            registry,
            "metrics",
            trial_id=trial,
            group="validation",
            steps_completed=1,
            metrics=json.dumps({"a\x00b": 7.5}),
            reported_at=schema.utcnow(),
        )
        for name, config in (("odd-list", "[1, 2]"), ("odd-searcher", '{"searcher": "x"}')):
            _insert_raw(registry, "experiments", name=name, config=config, state="ACTIVE")
        names += ["odd-nul", "odd-list", "odd-searcher"]
        ids = [e.id for e in registry.list_experiments()]
        assert len(ids) == 6
    settings_ = UiSettings(
        registry_url=registry_url,
        storage_url=str(tmp_path / "store"),
        allowed_hosts=("testserver",),
    )
    with TestClient(create_app(settings_)) as client:
        page = client.get("/experiments")
        assert page.status_code == 200, page.text[-2000:]
        for name in names:
            assert name in page.text
        assert "0.25" in page.text and "2.25" in page.text  # the good rows' best values
        for exp_id in ids[:3]:
            assert client.get(f"/experiments/{exp_id}").status_code == 200
