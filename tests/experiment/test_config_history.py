"""Configs from Determined's history and defaults (issue 28, items 2 and 3): a storage block of
GC keys alone keeps the default storage, ``{batches: 0}`` periods are off, and keys Determined
removed are ignored with one warning."""

import logging
import os
import sys
import textwrap

import pytest

from ckptstore import errors
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing import scan
from ckptstore.experiment import create_experiment, describe_experiment
from ckptstore.experiment.config import Length, parse_config, parse_length
from ckptstore.experiment.runner import warn_ignored_keys
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage

SCRIPT = {"hyperparameters": {"units": 4}, "entrypoint": "python3 train.py"}

THREE_CHECKPOINTS = """
import ckptstore as det

with det.core.init() as core_context:
    for step in (1, 2, 3):
        with core_context.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
            (path / "step.txt").write_text(str(step))
        core_context.train.report_validation_metrics(step, {"val_loss": 1.0 / step})
"""


def test_a_block_of_gc_keys_keeps_the_default_storage():
    config = parse_config({**SCRIPT, "checkpoint_storage": {"save_trial_best": 3}})
    assert config.checkpoint_storage is None
    assert config.gc_settings() == {
        "save_experiment_best": 0,
        "save_trial_best": 3,
        "save_trial_latest": 1,
    }
    with pytest.raises(errors.InvalidConfig, match=r"`checkpoint_storage.type`: missing"):
        parse_config({**SCRIPT, "checkpoint_storage": {"save_trial_best": 3, "bucket": "b"}})


@pytest.mark.parametrize("block", [None, {"save_trial_latest": 1, "save_trial_best": 0}])
def test_gc_keys_alone_apply_to_the_default_storage_end_to_end(tmp_path, monkeypatch, block):
    """A script trial saves 3 checkpoints in the default storage (CKPTSTORE_STORAGE): all 3
    stay without GC keys, only the latest with ``{save_trial_latest: 1, save_trial_best: 0}``."""
    storage = tmp_path / "default-storage"
    monkeypatch.setenv("CKPTSTORE_STORAGE", str(storage))
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    (tmp_path / "train.py").write_text(textwrap.dedent(THREE_CHECKPOINTS))
    raw = {
        "hyperparameters": {"units": 4},
        "searcher": {"name": "single", "metric": "val_loss"},
        "entrypoint": f"{sys.executable} train.py",
    }
    if block is not None:
        raw["checkpoint_storage"] = block
    registry = f"sqlite:///{tmp_path / 'r.db'}"
    exp_id = create_experiment(raw, tmp_path, registry=registry)
    (trial,) = describe_experiment(exp_id, registry=registry)["trials"]
    assert trial["state"] == "COMPLETED"
    with Registry(registry) as reg:
        rows = reg.list_checkpoints(trial_id=trial["id"])
    kept = sorted(c.steps_completed for c in rows if c.state == "COMMITTED")
    assert kept == ([1, 2, 3] if block is None else [3])
    assert len(rows) == 3  # GC marked the others DELETED
    with open_storage(str(storage)) as store:  # the trial wrote to the default storage
        on_disk = [
            ckpt_metadata.read_metadata(store, u)["steps_completed"]
            for u in scan.list_committed(store)
        ]
    assert sorted(on_disk) == kept


def test_zero_periods_are_off():
    config = parse_config(
        {
            **SCRIPT,
            "min_validation_period": {"batches": 0},
            "min_checkpoint_period": {"epochs": 0},
        }
    )
    assert config.min_validation_period is None and config.min_checkpoint_period is None
    with pytest.raises(errors.InvalidConfig, match=r"`searcher.max_length.batches`"):
        parse_config(
            {**SCRIPT, "searcher": {"name": "single", "metric": "m", "max_length": {"batches": 0}}}
        )


def test_removed_keys_are_ignored_with_one_warning(caplog):
    raw = {
        **SCRIPT,
        "data_layer": {"type": "shared_fs"},
        "batches_per_step": 100,
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_trials": 2,
            "step_budget": 500,
            "target_trial_steps": 16,
        },
        "resources": {"agent_label": ""},
        "environment": {"image": "x"},
    }
    config = parse_config(raw)
    assert config.ignored_keys == (
        "data_layer (removed from Determined)",
        "batches_per_step (removed from Determined)",
        "searcher.step_budget",
        "searcher.target_trial_steps",
        "resources.agent_label",
        "environment.image",
    )
    with caplog.at_level(logging.WARNING, logger="ckptstore.experiment.runner"):
        warn_ignored_keys(config)
    (record,) = caplog.records
    assert "data_layer" in record.getMessage() and "searcher.step_budget" in record.getMessage()


def test_max_concurrent_trials_zero_is_one_per_cpu():
    """Determined's ``max_concurrent_trials: 0`` lets the cluster decide; here one per CPU."""
    searcher = {"name": "random", "metric": "val_loss", "max_trials": 64}
    config = parse_config({**SCRIPT, "searcher": {**searcher, "max_concurrent_trials": 0}})
    assert config.searcher.max_concurrent_trials == max(1, os.cpu_count() or 1)
    assert parse_config({**SCRIPT, "searcher": searcher}).searcher.max_concurrent_trials == 1


def test_parse_length_names_the_key_it_checks():
    assert parse_length({"epochs": 2}, "min_validation_period", 100) == Length("epochs", 2)
    assert parse_length(3, "min_validation_period", 100) == Length("batches", 300)
    with pytest.raises(errors.InvalidConfig, match=r"`min_validation_period.batchez`.*`batches`"):
        parse_length({"batchez": 1}, "min_validation_period", 100)
