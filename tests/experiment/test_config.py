"""Experiment config parsing: good configs parse, bad ones fail naming the key and the fix."""

import copy

import pytest

from ckptstore import errors
from ckptstore.experiment.config import Length, load_config, parse_config

BASE = {
    "description": "t",
    "hyperparameters": {
        "global_batch_size": 32,
        "lr": {"type": "log", "minval": -4, "maxval": -1},
        "units": {"type": "int", "minval": 8, "maxval": 64},
        "act": {"type": "categorical", "vals": ["relu", "tanh"]},
        "drop": {"type": "double", "minval": 0.0, "maxval": 0.5},
        "opt": {"beta": {"type": "const", "val": 0.9}},
    },
    "searcher": {
        "name": "random",
        "metric": "val_loss",
        "max_length": {"batches": 100},
        "max_trials": 4,
    },
    "min_validation_period": {"batches": 10},
    "entrypoint": "model_def:MNISTTrial",
}


def make(**changes):
    raw = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = raw
        parts = dotted.split("__")
        for part in parts[:-1]:
            node = node[part]
        if value is ...:
            node.pop(parts[-1])
        else:
            node[parts[-1]] = value
    return raw


def test_good_config_parses():
    config = parse_config(make())
    assert config.searcher.max_trials == 4
    assert config.searcher.max_length == Length("batches", 100)
    assert {hp.name for hp in config.hyperparameters} >= {"lr", "opt.beta"}
    assert config.entrypoint.module == "model_def" and config.entrypoint.attr == "MNISTTrial"


def test_tutorial_const_yaml_uses_steps():
    config = load_config("examples/mnist_tfkeras_trial/const.yaml")
    assert config.searcher.name == "single"
    assert config.searcher.max_length.to_batches(32, None) == 4000  # 40 steps of 100 batches
    assert config.min_validation_period.to_batches(32, None) == 1000


def test_lengths_in_records_and_epochs():
    # Determined's harness rounds down to whole batches (at least 1)
    assert Length("records", 100).to_batches(32, None) == 3
    assert Length("records", 10).to_batches(32, None) == 1
    assert Length("epochs", 2).to_batches(32, 320) == 20
    assert Length("epochs", 3).to_batches(48, 50000) == 3125  # 150000 // 48
    with pytest.raises(errors.InvalidConfig, match="records_per_epoch"):
        Length("epochs", 2).to_batches(32, None)


def test_grid_needs_count_and_counts_trials():
    with pytest.raises(errors.InvalidConfig, match=r"hyperparameters.lr.count"):
        parse_config(make(searcher__name="grid"))
    raw = make(searcher__name="grid")
    raw["hyperparameters"] = {
        "global_batch_size": 32,
        "lr": {"type": "log", "minval": -3, "maxval": -1, "count": 3},
        "act": {"type": "categorical", "vals": ["relu", "tanh"]},
    }
    config = parse_config(raw)
    assert config.searcher.max_trials == 6
    lr = next(hp for hp in config.hyperparameters if hp.name == "lr")
    assert lr.grid_values() == pytest.approx([0.001, 0.01, 0.1])


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"searcher__name": "bayes"}, "searcher.name"),
        ({"searcher__metric": ...}, "searcher.metric"),
        ({"searcher__max_length": ...}, "searcher.max_length"),
        ({"searcher__max_steps": 5}, "searcher.max_length"),  # both given
        ({"searcher__max_length": {"batchez": 5}}, "searcher.max_length.batchez"),
        ({"searcher__max_length": {"batches": -1}}, "searcher.max_length.batches"),
        ({"searcher__max_trials": ...}, "searcher.max_trials"),
        ({"searcher__max_trials": 0}, "searcher.max_trials"),
        ({"searcher__max_concurrent_trials": "2"}, "searcher.max_concurrent_trials"),
        ({"searcher__smaller_is_better": "yes"}, "searcher.smaller_is_better"),
        ({"searcher__metrc": "x"}, "searcher.metrc"),
        ({"seracher": {}}, "seracher"),
        ({"hyperparameters__lr__type": "loguniform"}, "hyperparameters.lr.type"),
        ({"hyperparameters__lr__maxval": ...}, "hyperparameters.lr.maxval"),
        ({"hyperparameters__units__minval": 1.5}, "hyperparameters.units.minval"),
        ({"hyperparameters__drop__minval": 0.9}, "hyperparameters.drop"),
        ({"hyperparameters__act__vals": []}, "hyperparameters.act.vals"),
        ({"hyperparameters__act__valz": [1]}, "hyperparameters.act.valz"),
        ({"hyperparameters__global_batch_size": ...}, "hyperparameters.global_batch_size"),
        ({"hyperparameters__global_batch_size": 0}, "hyperparameters.global_batch_size"),
        ({"entrypoint": ...}, "entrypoint"),
        ({"min_validation_period": {"steps": 3}}, "min_validation_period.steps"),
        ({"records_per_epoch": -5}, "records_per_epoch"),
        ({"checkpoint_storage": {"bucket": "b"}}, "checkpoint_storage.type"),
        (
            {"checkpoint_storage": {"type": "s3", "bucket": "b", "save_trial_best": -1}},
            "checkpoint_storage.save_trial_best",
        ),
        ({"reproducibility": {"experiment_seed": "x"}}, "reproducibility.experiment_seed"),
        ({"data": [1, 2]}, "data"),
    ],
)
def test_bad_config_names_the_key(changes, key):
    with pytest.raises(errors.InvalidConfig) as info:
        parse_config(make(**changes))
    assert f"`{key}`" in str(info.value)


def test_missing_global_batch_size_is_determineds_invalid_experiment():
    with pytest.raises(errors.InvalidExperimentException, match="global_batch_size`: missing"):
        parse_config(make(hyperparameters__global_batch_size=...))


def test_single_searcher_rejects_ranges():
    with pytest.raises(errors.InvalidConfig, match=r"`hyperparameters.lr`.*single"):
        parse_config(make(searcher__name="single"))


def test_typo_gets_a_suggestion():
    with pytest.raises(errors.InvalidConfig, match="Did you mean `searcher`"):
        parse_config(make(seracher={}))


def test_script_entrypoint_needs_no_batch_size():
    config = parse_config(make(entrypoint="python3 train.py --epochs 2"))
    assert not config.entrypoint.is_trial_class
    assert config.entrypoint.command() == ["python3", "train.py", "--epochs", "2"]


def test_cluster_only_keys_are_ignored():
    # resources.slots_per_trial starts workers, for scripts (issue 13) and TFKerasTrials
    # (issue 29); the cluster-only keys stay ignored.
    config = parse_config(
        make(resources={"slots_per_trial": 2, "resource_pool": "gpu"}, environment={"image": "x"})
    )
    assert config.slots_per_trial == 2
    assert config.ignored_keys == (
        "resources.resource_pool",
        "environment.image",
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            ["A=1", "URL=postgres://h/db?x=1", "EMPTY=", "A=2"],
            {"A": "2", "URL": "postgres://h/db?x=1", "EMPTY": ""},
        ),
        ({"cpu": ["A=1"], "cuda": ["A=9", "GPU=1"]}, {"A": "1"}),  # trials ask for CPUs
        ({"cuda": ["GPU=1"]}, {}),
    ],
)
def test_environment_variables_in_both_determined_forms(given, expected):
    config = parse_config(make(environment={"environment_variables": given, "image": "x"}))
    assert config.environment_variables == expected
    assert config.ignored_keys == ("environment.image",)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        (["A"], r"`environment.environment_variables.0`: expected NAME=value.*received 'A'"),
        ({"cpu": ["1A=x"]}, r"`environment.environment_variables.cpu.0`: expected NAME=value"),
        ({"tpu": []}, r"`environment.environment_variables.tpu`: unknown key"),
        ("A=1", r"`environment.environment_variables`: input should be a valid list"),
        (["CKPTSTORE_STORAGE=/x"], r"CKPTSTORE_STORAGE is set by ckptstore for every trial"),
    ],
)
def test_bad_environment_variables_name_the_entry_and_the_fix(given, match):
    with pytest.raises(errors.InvalidConfig, match=match):
        parse_config(make(environment={"environment_variables": given}))


def test_gc_settings_from_storage_dict():
    config = parse_config(
        make(checkpoint_storage={"type": "shared_fs", "host_path": "/x", "save_trial_latest": 3})
    )
    assert config.gc_settings() == {
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 3,
    }


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(errors.InvalidConfig, match="Cannot read"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("searcher: [\n")
    with pytest.raises(errors.InvalidConfig, match="not valid YAML"):
        load_config(bad)


def test_a_key_written_twice_is_refused_and_merge_keys_still_override(tmp_path):
    """PyYAML keeps the last of two equal keys silently (a second ``lr:`` under
    ``hyperparameters`` would train with a value the reader never sees first); Determined's
    reader refused it, and so does this one, naming the key and its line. Keys merged in with
    ``<<`` may still be overridden."""
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "name: t\nhyperparameters:\n  lr: 2e-4\n  global_batch_size: 8\n  lr: 1e-3\n"
        "entrypoint: model_def:T\nsearcher:\n  name: single\n  metric: val_loss\n"
        "  max_length:\n    batches: 4\n"
    )
    with pytest.raises(errors.InvalidConfig, match=r"(?s)key 'lr' twice.*line 5"):
        load_config(twice)
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "base: &b {lr: 0.1, global_batch_size: 8}\nname: m\nhyperparameters:\n  <<: *b\n"
        "  lr: 0.01\nentrypoint: model_def:T\nsearcher:\n  name: single\n  metric: val_loss\n"
        "  max_length:\n    batches: 4\n"
    )
    from ckptstore.yamlsafe import load_yaml

    assert load_yaml(merged, "experiment config", "x")["hyperparameters"]["lr"] == 0.01
