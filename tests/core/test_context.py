"""core.init(): trial resolution, checkpoints, metrics, GC policy, preemption, trial info."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore import errors
from ckptstore.core import init
from ckptstore.core._heartbeat import HEARTBEAT_ENV
from ckptstore.core._info import TRIAL_STATE_BY_ENV
from ckptstore.core._train import to_jsonable
from ckptstore.registry import Registry


def _save(ctx, steps, **metrics):
    with ctx.checkpoint.store_path({"steps_completed": steps, "metrics": metrics}) as (path, uuid):
        Path(path, "weights.bin").write_bytes(os.urandom(64))
    return uuid


def test_new_trial_is_created_and_latest_checkpoint_found(where):
    storage, registry = where
    with init(storage=storage, registry=registry, hparams={"lr": 0.1}) as ctx:
        trial_id = ctx.info.trial.trial_id
        assert ctx.info.task_type == "TRIAL" and ctx.info.latest_checkpoint is None
        assert ctx.info.hparams == {"lr": 0.1}
        _save(ctx, 5)
        second = _save(ctx, 10)
    with init(storage=storage, registry=registry, trial_id=trial_id) as ctx:
        assert ctx.info.latest_checkpoint == second
        assert ctx.info.trial.hparams == {"lr": 0.1}  # from the trial row
        assert ctx.checkpoint.get_metadata(second)["trial_id"] == trial_id
    with init(storage=storage, registry=registry) as ctx:
        assert ctx.info.trial.trial_id != trial_id


def test_env_vars_are_honoured(where, monkeypatch):
    storage, registry = where
    monkeypatch.setenv("CKPTSTORE_STORAGE", storage)
    monkeypatch.setenv("CKPTSTORE_REGISTRY", registry)
    monkeypatch.setenv("CKPTSTORE_TRIAL_ID", "42")
    monkeypatch.setenv("CKPTSTORE_HPARAMS", '{"units": 8}')
    with init() as ctx:
        assert (ctx.trial_id, ctx.hparams) == (42, {"units": 8})
        uuid = _save(ctx, 1)
    assert Path(storage, uuid, "MANIFEST.json").exists()
    info = ckptstore.get_cluster_info()
    assert (info.trial.trial_id, info.trial.hparams, info.latest_checkpoint) == (
        42,
        {"units": 8},
        uuid,
    )
    monkeypatch.setenv("CKPTSTORE_TRIAL_ID", "forty-two")
    with pytest.raises(errors.InvalidConfig, match="CKPTSTORE_TRIAL_ID"):
        ckptstore.get_trial_info()
    monkeypatch.setenv("CKPTSTORE_TRIAL_ID", "1")
    monkeypatch.setenv("CKPTSTORE_HPARAMS", "[1, 2]")
    with pytest.raises(errors.InvalidConfig, match="JSON object"):
        ckptstore.get_trial_info()
    monkeypatch.delenv("CKPTSTORE_TRIAL_ID")
    assert ckptstore.get_trial_info() is None


def test_metrics_reach_the_registry_as_json(where):
    storage, registry = where
    with init(storage=storage, registry=registry, trial_id=2) as ctx:
        ctx.train.report_training_metrics(10, {"loss": np.float32(0.5), "nan": float("nan")})
        ctx.train.report_validation_metrics(10, {"val_loss": np.array(0.25)})
        with pytest.raises(errors.InvalidConfig, match="steps_completed"):
            ctx.train.report_training_metrics(-1, {"loss": 1.0})
    with Registry(registry) as reg:
        train = reg.get_metrics(2, group="training")
        val = reg.get_metrics(2, group="validation")
    assert train[0].metrics == {"loss": 0.5, "nan": None} and train[0].steps_completed == 10
    assert val[0].metrics == {"val_loss": 0.25}


def test_to_jsonable():
    import tensorflow as tf

    got = to_jsonable({"a": tf.constant(2.0), 3: [np.int64(4), math.inf], "s": "x"})
    assert got == {"a": 2.0, "3": [4, None], "s": "x"}


def test_checkpoint_gc_policy(where):
    storage, registry = where
    gc = {"save_trial_latest": 1, "save_trial_best": 1, "metric": "val_loss"}
    with init(storage=storage, registry=registry, trial_id=5, checkpoint_gc=gc) as ctx:
        best = _save(ctx, 1, val_loss=0.1)
        _save(ctx, 2, val_loss=0.5)
        latest = _save(ctx, 3, val_loss=0.9)
        ctx.checkpoint.wait()
        ctx.checkpoint.gc()
    with Registry(registry) as reg:
        live = {c.uuid for c in reg.list_checkpoints(trial_id=5, states=("COMMITTED",))}
    assert live == {best, latest}
    # the checkpoint folders left (beside them: .ckptstore-blobs/, the shared chunks, and the
    # tombstones of the deleted ones: a MANIFEST.json alone)
    folders = [n for n in os.listdir(storage) if not n.startswith(".")]
    kept = [n for n in folders if os.listdir(os.path.join(storage, n)) != ["MANIFEST.json"]]
    assert sorted(kept) == sorted([best, latest]) and len(folders) == 3
    with pytest.raises(errors.InvalidConfig, match="save_trial_lastest"):
        with init(storage=storage, registry=registry, checkpoint_gc={"save_trial_lastest": 1}):
            pass


def test_no_gc_by_default_and_storage_dict_gc_keys(where):
    storage, registry = where
    with init(storage=storage, registry=registry, trial_id=6) as ctx:
        uuids = {_save(ctx, s) for s in range(3)}
    assert uuids <= set(os.listdir(storage))
    config = {
        "type": "shared_fs",
        "host_path": storage,
        "save_trial_latest": 1,
        "save_trial_best": 0,
    }
    with init(storage=config, registry=registry, trial_id=7) as ctx:
        _save(ctx, 1)
        last = _save(ctx, 2)
        ctx.checkpoint.wait()
        ctx.checkpoint.gc()
    with Registry(registry) as reg:
        live = [c.uuid for c in reg.list_checkpoints(trial_id=7, states=("COMMITTED",))]
    assert live == [last]


def test_preemption_by_signal_and_handlers_restored(where):
    storage, registry = where
    before = signal.getsignal(signal.SIGTERM)
    with init(storage=storage, registry=registry, trial_id=8, set_trial_state=True) as ctx:
        assert signal.getsignal(signal.SIGTERM) is not before
        assert ctx.preempt.should_preempt() is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert ctx.preempt.should_preempt() is True
    assert signal.getsignal(signal.SIGTERM) is before
    with Registry(registry) as reg:
        assert reg.get_trial(8).state == "PAUSED"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_ends_on_sigterm(where):
    """A process forked from the training one (Keras's ``use_multiprocessing`` pool workers)
    inherits the handler; ``Pool.terminate()`` sends them SIGTERM, which must end them (a
    handler that only set the flag left the pool waiting on them forever)."""
    storage, registry = where
    with init(storage=storage, registry=registry, trial_id=9) as ctx:
        pid = os.fork()
        if pid == 0:  # the child: SIGTERM ends it before it can exit with 3
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
        assert ctx.preempt.should_preempt() is False  # the training process was not asked


def test_trial_state_on_error_and_completion(where, monkeypatch):
    """Script runs set their own state by default (ACTIVE on entry, then COMPLETED, PAUSED or
    ERROR); a process started by the experiment runner leaves it to the runner."""
    storage, registry = where
    with pytest.raises(RuntimeError):
        with init(storage=storage, registry=registry, trial_id=9):
            raise RuntimeError("boom")
    with Registry(registry) as reg:
        assert reg.get_trial(9).state == "ERROR"
    with init(storage=storage, registry=registry, trial_id=9) as ctx:  # resumed: live again
        assert ctx.registry.get_trial(9).state == "ACTIVE"
        assert ctx.registry.get_trial(9).heartbeat_age() < 60
    with pytest.raises(SystemExit):
        with init(storage=storage, registry=registry, trial_id=10):
            sys.exit(0)  # a clean end
    with init(storage=storage, registry=registry, trial_id=11, set_trial_state=False):
        pass
    monkeypatch.setenv(TRIAL_STATE_BY_ENV, "ckptstore experiment")
    with init(storage=storage, registry=registry, trial_id=12):
        pass
    with Registry(registry) as reg:
        trials = [reg.get_trial(t) for t in (9, 10, 11, 12)]
    assert [t.state for t in trials] == ["COMPLETED", "COMPLETED", "ACTIVE", "ACTIVE"]
    assert [t.status for t in trials] == ["COMPLETED", "COMPLETED", "ACTIVE", "ACTIVE"]
    assert all(t.heartbeat_at is not None for t in trials)  # runner trials beat too


def test_heartbeat_is_recorded_while_the_context_is_open(where, monkeypatch):
    storage, registry = where
    monkeypatch.setenv(HEARTBEAT_ENV, "0.1")
    with init(storage=storage, registry=registry, trial_id=13) as ctx:
        first = ctx.registry.get_trial(13).heartbeat_at
        deadline = time.monotonic() + 20
        while ctx.registry.get_trial(13).heartbeat_at == first:
            assert time.monotonic() < deadline, "no second heartbeat within 20 s"
            time.sleep(0.05)
        thread = ctx._heartbeat._thread
    assert not thread.is_alive()  # stopped on exit, before the registry closed


def test_background_upload_failure_is_raised_on_exit(where, tmp_path, s3_server):
    _, registry = where
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 10)
    with pytest.raises(errors.CkptstoreError) as caught:
        with init(storage="s3://ckptstore-no-such-bucket/p", registry=registry, trial_id=12) as ctx:
            ctx.checkpoint.upload(str(src), {"steps_completed": 1}, background=True)
    assert "no-such-bucket" in str(caught.value) or "no-such-bucket" in str(caught.value.__cause__)


def test_old_import_paths_warn_and_give_the_same_objects():
    import importlib
    import sys
    import warnings

    from ckptstore import _deprecated

    for old, new in _deprecated.MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert any(
            issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught
        ), old


def test_experiment_best_validation_follows_the_one_metric_rule(tmp_path):
    """The experiment's best validation is ranked by checkpointing.metrics like GC and the
    registry: across the experiment's trials, finite values only, Keras's `val_` prefix and
    Determined's nested `validation_metrics` both found."""
    from ckptstore.core._train import TrainContext

    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as reg:
        exp_id = reg.create_experiment("e")
        a = reg.create_trial(experiment_id=exp_id)
        b = reg.create_trial(experiment_id=exp_id)
        other = reg.create_trial()  # another experiment's better value is not ours
        reg.report_metrics(a, "validation", 10, {"val_loss": 0.5})
        reg.report_metrics(a, "validation", 20, {"loss": "n/a", "val_loss": 0.31})
        reg.report_metrics(b, "validation", 10, {"validation_metrics": {"val_loss": 0.3}})
        reg.report_metrics(b, "validation", 20, {"val_loss": float("inf")})
        reg.report_metrics(other, "validation", 10, {"val_loss": 0.01})
        train = TrainContext(
            reg, trial_id=a, experiment_id=exp_id, searcher_metric="loss", smaller_is_better=True
        )
        assert train.get_experiment_best_validation() == 0.3
        larger = TrainContext(
            reg,
            trial_id=a,
            experiment_id=exp_id,
            searcher_metric="val_loss",
            smaller_is_better=False,
        )
        assert larger.get_experiment_best_validation() == 0.5
        assert TrainContext(reg, trial_id=other).get_experiment_best_validation() is None
