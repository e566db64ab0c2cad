"""Determined's Core API names on ckptstore, used as a Determined script uses them, on local
storage and a SQLite registry (no TensorFlow)."""

from __future__ import annotations

import logging
import pathlib

import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.checkpointing import format as fmt


def test_log_format_is_determineds(caplog):
    assert det.LOG_FORMAT == "%(levelname)s: [%(process)s] %(name)s: %(message)s"
    formatter = logging.Formatter(det.LOG_FORMAT)
    record = logging.LogRecord("train", logging.INFO, __file__, 1, "hello", None, None)
    assert formatter.format(record).startswith("INFO: [")


def test_paths_are_pathlib_and_download_mode_is_positional(where, tmp_path):
    with det.core.init(
        distributed=det.core.DummyDistributedContext(), **where.core_kwargs()
    ) as core_context:
        with core_context.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            assert isinstance(path, pathlib.Path)
            (path / "model").mkdir()
            (path / "model" / "w.bin").write_bytes(b"w")
            (path / "notes.txt").write_text("n")
        with core_context.checkpoint.restore_path(
            uuid, det.core.DownloadMode.NoSharedDownload
        ) as path:
            assert isinstance(path, pathlib.Path)
            assert (path / "model" / "w.bin").read_bytes() == b"w"
        out = tmp_path / "out"
        core_context.checkpoint.download(
            uuid, out, "LOCAL_WORKERS_SHARE_DOWNLOAD", selector="model/*"
        )
        assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["w.bin"]
        with pytest.raises(errors.InvalidConfig, match="LocalWorkersShareDownload"):
            core_context.checkpoint.download(uuid, out, "shared")


def test_upload_selector_and_empty_shard(where, tmp_path):
    src = tmp_path / "src"
    (src / "keep").mkdir(parents=True)
    (src / "keep" / "a.bin").write_bytes(b"a")
    (src / "skip.tmp").write_bytes(b"t")
    with det.core.init(**where.core_kwargs()) as core_context:
        uuid = core_context.checkpoint.upload(
            src, {"steps_completed": 2}, selector=lambda rel: not rel.endswith(".tmp")
        )
        assert core_context.checkpoint.get_metadata(uuid)["steps_completed"] == 2
        files = fmt.read_manifest(core_context.storage, uuid)["files"]
        assert "keep/a.bin" in files and "skip.tmp" not in files
        assert (src / "skip.tmp").exists()  # the caller's folder is left alone
        empty = core_context.checkpoint.upload(None, {"steps_completed": 3}, shard=True)
        assert core_context.checkpoint.get_metadata(empty)["steps_completed"] == 3


def test_trial_info_seed_and_cluster_id(where, monkeypatch):
    with det.core.init(**where.core_kwargs()) as core_context:
        info = core_context.info
        assert info.trial.trial_seed == info.trial.trial_id
        first = info.cluster_id
    with det.core.init(**where.core_kwargs()) as core_context:
        assert core_context.info.cluster_id == first  # same registry, same id
    monkeypatch.setenv("CKPTSTORE_TRIAL_SEED", "1234")
    assert det.TrialInfo(trial_id=9).trial_seed == 1234


def test_modes_preempt_and_context_calls(where):
    with pytest.raises(errors.InvalidConfig, match="WorkersAskChief"):
        with det.core.init(preempt_mode="ASK_EVERYONE", **where.core_kwargs()):
            pass
    with det.core.init(
        preempt_mode=det.core.PreemptMode.ChiefOnly,
        tensorboard_mode="MANUAL",
        **where.core_kwargs(),
    ) as core_context:
        assert core_context.start() is core_context
        assert core_context.preempt.should_preempt() is False
        core_context.preempt.request_preemption()
        assert core_context.preempt.should_preempt() is True
        core_context.train.set_status("training")
        assert core_context.train.status == "training"
        core_context.train.report_early_exit(det.core.EarlyExitReason.INVALID_HP)
        assert core_context.train.early_exit is det.core.EarlyExitReason.INVALID_HP
        core_context.profiler.on()
        core_context.profiler.off()
        core_context.alert("done", "trained", level="info")
        with pytest.raises(errors.InvalidConfig, match="level"):
            core_context.alert("x", level="loud")
        core_context.alert("careful", level="warn")


def test_cluster_only_calls_raise_not_supported():
    for call in (
        lambda: det.core.DistributedContext.from_horovod(object()),
        lambda: det.core.DistributedContext.from_deepspeed(),
        lambda: det.core.DistributedContext.from_torch_distributed(),
    ):
        with pytest.raises(errors.NotSupported, match="from_tf_config"):
            call()
    assert issubclass(errors.NotSupported, NotImplementedError)
    assert det.InvalidHP("lr too big").msg == "lr too big"


def test_collectives_take_determineds_parameter_name():
    dist = det.core.DummyDistributedContext()
    assert dist.allgather(stuff=1) == [1]
    assert dist.broadcast(stuff="x") == "x"
    assert dist.gather_local(stuff=2) == [2]
    assert (dist.get_rank(), dist.get_size(), dist.get_num_agents()) == (0, 1, 1)


def test_trial_context_from_config_draws_hyperparameters():
    config = {
        "hyperparameters": {
            "global_batch_size": 32,
            "lr": {"type": "log", "minval": -4, "maxval": -1},
            "layers": {"type": "int", "minval": 1, "maxval": 3},
            "model": {"act": {"type": "categorical", "vals": ["relu", "tanh"]}},
        },
        "reproducibility": {"experiment_seed": 5},
    }
    context = det.keras.TFKerasTrialContext.from_config(config)
    assert context.get_global_batch_size() == 32
    assert 1e-4 <= context.get_hparam("lr") <= 1e-1
    assert context.get_hparam("layers") in (1, 2, 3)
    assert context.get_hparam("model")["act"] in ("relu", "tanh")
    assert det.keras.TFKerasTrialContext.from_config(config).get_hparams() == context.get_hparams()
    assert context.get_experiment_config() == config
