"""Determined 0.38 experiment configs load unchanged (issue 13.3) and the reference's
``entrypoint_script`` config without a searcher is one trial (issue 21)."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.experiment.config import Length, parse_config

# The shape of Determined 0.38.1's iris_tf_keras/adaptive.yaml (our own values).
ADAPTIVE_038 = """
name: iris_adaptive
environment:
  image: determinedai/tensorflow-ngc:0.38.1
hyperparameters:
  learning_rate: {type: log, minval: -5.0, maxval: 1.0, base: 10.0}
  layer1_dense_size: {type: int, minval: 4, maxval: 32}
  global_batch_size: {type: int, minval: 5, maxval: 30}
searcher:
  name: adaptive_asha
  metric: val_categorical_accuracy
  smaller_is_better: false
  max_length:
    batches: 6400
  max_trials: 512
entrypoint: >-
  python3 -m determined.launch.tensorflow --
  python3 train.py
"""


def test_adaptive_038_loads_and_has_determined_rungs():
    config = parse_config(yaml.safe_load(ADAPTIVE_038))
    assert config.ignored_keys == ("environment.image",)
    # 512 trials, divisor 4 -> min(5, floor(log4 512) + 1) = 5 rungs.
    assert config.searcher.rung_lengths() == [25, 100, 400, 1600, 6400]


def test_single_without_max_length_for_a_script():
    raw = {
        "name": "const",
        "hyperparameters": {"learning_rate": 1e-4, "global_batch_size": 16},
        "searcher": {"name": "single", "metric": "val_loss"},
        "entrypoint": "python3 train.py",
        "max_restarts": 0,
    }
    config = parse_config(raw)
    assert config.searcher.max_length is None and config.searcher.rung_lengths() == []
    # A TFKerasTrial cannot know how long to train without it.
    raw["entrypoint"] = "model_def:IrisTrial"
    with pytest.raises(errors.InvalidConfig, match=r"`searcher.max_length`.*TFKerasTrial"):
        parse_config(raw)


def test_asha_time_metric_form():
    raw = yaml.safe_load(ADAPTIVE_038)
    del raw["searcher"]["max_length"]
    raw["searcher"].update(time_metric="batches", max_time=640, max_trials=16)
    config = parse_config(raw)
    assert config.searcher.search_length() == ("batches", 640)
    assert config.searcher.rung_lengths() == [40, 160, 640]
    raw["entrypoint"] = "model_def:IrisTrial"
    assert parse_config(raw).searcher.max_length == Length("batches", 640)
    raw["searcher"]["time_metric"] = "wall_seconds"
    with pytest.raises(errors.InvalidConfig, match="`searcher.time_metric`"):
        parse_config(raw)
    raw["searcher"].pop("max_time")
    raw["entrypoint"] = "python3 train.py"
    with pytest.raises(errors.InvalidConfig, match="`searcher.max_time`"):
        parse_config(raw)


def test_every_038_key_is_accepted_and_cluster_ones_named_once():
    raw = {
        "name": "full",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": 50,  # the older unitless form: steps of scheduling_unit batches
            "source_trial_id": 3,
        },
        "records_per_epoch": 100,
        "scheduling_unit": 10,
        "min_validation_period": {"batches": 10},
        "min_checkpoint_period": {"epochs": 1},
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "save_trial_best": 2},
        "resources": {"slots_per_trial": 1, "max_slots": 4, "priority": 1},
        "environment": {"image": "x", "environment_variables": ["A=1"]},
        "bind_mounts": [{"host_path": "/data", "container_path": "/data"}],
        "profiling": {"enabled": True},
        "optimizations": {"aggregation_frequency": 1},
        "max_restarts": 2,
        "entrypoint": "model_def:Trial",
    }
    config = parse_config(raw)
    assert config.searcher.max_length == Length("batches", 500)
    assert config.max_restarts == 2
    assert config.environment_variables == {"A": "1"}  # they reach the trials (issue 29)
    assert config.searcher.source_trial_id == 3  # Determined's warm start, read (issue 28 #7)
    assert set(config.ignored_keys) == {
        "environment.image",
        "bind_mounts",
        "profiling",
        "optimizations",
        "resources.max_slots",
        "resources.priority",
    }


def test_checkpoint_policy_default_values_and_scripts():
    """Determined's default is `best`; a TFKerasTrial reads it, a script is told it is ignored
    (Determined applies it in its Trial harness only); anything else is refused."""
    trial = {
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 4}},
        "entrypoint": "model_def:Trial",
    }
    assert parse_config(trial).checkpoint_policy == "best"
    for policy in ("best", "all", "none"):
        config = parse_config({**trial, "checkpoint_policy": policy})
        assert config.checkpoint_policy == policy and config.ignored_keys == ()
    script = parse_config({**trial, "entrypoint": "python3 train.py", "checkpoint_policy": "all"})
    assert any(k.startswith("checkpoint_policy") for k in script.ignored_keys)
    with pytest.raises(errors.InvalidConfig, match="checkpoint_policy.*'some'"):
        parse_config({**trial, "checkpoint_policy": "some"})


@pytest.mark.parametrize(
    "section, key, suggestion",
    [
        ("resources", "slots_per_trail", "slots_per_trial"),
        ("searcher", "time_metrc", "time_metric"),
        (None, "bind_mount", "bind_mounts"),
    ],
)
def test_unknown_keys_still_rejected_with_did_you_mean(section, key, suggestion):
    raw = yaml.safe_load(ADAPTIVE_038)
    if section is None:
        raw[key] = 1
    else:
        raw.setdefault(section, {})[key] = 1
    with pytest.raises(errors.InvalidConfig, match=f"Did you mean `{suggestion}`"):
        parse_config(raw)


def test_reference_const_yaml_without_searcher_is_one_trial():
    raw = yaml.safe_load(
        "hyperparameters:\n  dropout: 0.5\n  global_batch_size: 128\n"
        "entrypoint_script: python3 train.py\n"
    )
    config = parse_config(raw)
    assert config.searcher.name == "single" and config.searcher.max_trials == 1
    assert config.searcher.metric == "val_loss" and config.searcher.max_length is None
    assert config.constant_hparams() == {"dropout": 0.5, "global_batch_size": 128}
    raw["hyperparameters"]["dropout"] = {"type": "double", "minval": 0.1, "maxval": 0.5}
    with pytest.raises(errors.InvalidConfig, match="`hyperparameters.dropout`"):
        parse_config(raw)


@given(
    total=st.integers(1, 100_000),
    divisor=st.integers(2, 8),
    max_rungs=st.integers(1, 8),
    max_trials=st.integers(1, 2000),
)
def test_rungs_are_increasing_and_end_at_the_length(total, divisor, max_rungs, max_trials):
    raw = {
        "searcher": {
            "name": "adaptive_asha",
            "metric": "val_loss",
            "max_length": {"batches": total},
            "divisor": divisor,
            "max_rungs": max_rungs,
            "max_trials": max_trials,
        },
        "entrypoint": "python3 train.py",
    }
    rungs = parse_config(raw).searcher.rung_lengths()
    assert rungs[-1] == total and rungs == sorted(set(rungs)) and rungs[0] >= 1
    assert len(rungs) <= min(max_rungs, max_trials)
    for low, high in zip(rungs, rungs[1:], strict=False):
        assert high <= low * divisor + divisor  # one division step apart (floors aside)


def test_warm_start_from_a_checkpoint_and_a_trial_at_once_is_refused():
    raw = {
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {
            "name": "single",
            "metric": "val_loss",
            "max_length": {"batches": 4},
            "source_checkpoint_uuid": "6f1c2a3b-0d4e-4f5a-8b6c-7d8e9f0a1b2c",
            "source_trial_id": 3,
        },
        "entrypoint": "model_def:Trial",
    }
    with pytest.raises(errors.InvalidConfig, match="source_trial_id.*Keep one of them"):
        parse_config(raw)
    del raw["searcher"]["source_trial_id"]
    assert parse_config(raw).searcher.source_checkpoint_uuid.startswith("6f1c2a3b")
    assert parse_config(raw).ignored_keys == ()
    script = parse_config({**raw, "entrypoint": "python3 train.py"})  # scripts load their own
    assert [k.split()[0] for k in script.ignored_keys] == ["searcher.source_checkpoint_uuid"]
