"""The published JSON Schema of experiment configs (issue 26): the repo's Determined-shaped
configs validate against it, it refuses what parse_config refuses for its shape, and the CLI
prints it."""

import functools
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.cli.main import cli
from ckptstore.experiment import config_json_schema, parse_config

REPO = Path(__file__).resolve().parents[2]
#: Every experiment config in the repository: the examples and Determined's shapes in the corpus.
CONFIGS = sorted(
    [*REPO.glob("examples/**/*.yaml"), *REPO.glob("tests/determined_compat/corpus/**/*.yaml")]
)


@functools.cache
def _validator():
    schema = config_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture
def validator():
    return _validator()


def test_the_repo_has_configs_to_check():
    assert len(CONFIGS) >= 10, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_repo_configs_validate_against_the_schema(validator, path):
    raw = yaml.safe_load(path.read_text())
    assert [e.message for e in validator.iter_errors(raw)] == []
    parse_config(raw)  # and the parser agrees


@pytest.mark.parametrize(
    "bad",
    [
        {"seracher": {}},
        {"searcher": {"name": "bayes", "metric": "m"}},
        {"searcher": {"name": "random", "metric": "m", "max_trials": 0}},
        {"searcher": {"name": "random", "metric": "m", "max_concurrent_trials": "2"}},
        {"hyperparameters": {"lr": {"type": "loguniform", "minval": 1, "maxval": 2}}},
        {"hyperparameters": {"lr": {"type": "int", "minval": 1.5, "maxval": 2}}},
        {"hyperparameters": {"lr": {"type": "categorical", "vals": []}}},
        {"hyperparameters": {"a.b": 1}},
        {"min_validation_period": {"steps": 3}},
        {"reproducibility": {"experiment_seed": -1}},
        {"resources": {"slots_per_trail": 2}},
        {"data": [1, 2]},
    ],
)
def test_schema_and_parser_refuse_the_same_shapes(validator, bad):
    raw = {"entrypoint": "python3 train.py", **bad}
    assert list(validator.iter_errors(raw)), raw
    with pytest.raises(errors.InvalidConfig):
        parse_config(raw)


# No integral floats: JSON Schema counts 0.0 as an "integer" where the strict parser wants an int
# (a YAML `0.0` at an int key is refused); the schema cannot say "not written as a float".
_leaf = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5).filter(lambda x: not x.is_integer()),
    st.text(max_size=3),
    st.booleans(),
)
_hp = st.one_of(
    _leaf,
    st.fixed_dictionaries({"type": st.just("const"), "val": _leaf}),
    st.fixed_dictionaries({"type": st.just("categorical"), "vals": st.lists(_leaf, max_size=3)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["int", "double", "log", "range"]), "minval": _leaf},
        optional={"maxval": _leaf, "count": st.integers(-1, 3), "base": _leaf},
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["lr", "units", "x.y"]), _hp, max_size=3))
def test_schema_and_parser_agree_on_hyperparameter_shapes(hparams):
    """Whatever the schema accepts the parser accepts, and the reverse, for hyperparameters
    alone (the parser's extra rules are between keys: ordered ranges, a log base of 1)."""
    raw = {
        "entrypoint": "python3 train.py",
        "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2},
        "hyperparameters": hparams,
    }
    schema_ok = not list(_validator().iter_errors(raw))
    try:
        parse_config(raw)
        parser_ok = True
    except errors.InvalidConfig as exc:
        parser_ok = False
        cross_key = "greater than maxval" in str(exc) or "base 1" in str(exc)
    else:
        cross_key = False
    assert schema_ok == parser_ok or (schema_ok and cross_key), (raw, schema_ok, parser_ok)


def test_cli_prints_the_schema():
    result = CliRunner().invoke(cli, ["experiment", "schema"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed == config_json_schema()
    assert {"searcher", "hyperparameters", "data_layer"} <= set(printed["properties"])
