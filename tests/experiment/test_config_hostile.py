"""Hostile experiment configs (issue 27, finding 7): each is refused with InvalidConfig (exit 2
from the CLI) in bounded time and memory, and a runner whose trial cannot start ends instead of
hanging."""

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptstore import errors
from ckptstore.cli.main import cli
from ckptstore.experiment import create_experiment, describe_experiment
from ckptstore.experiment.config import load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = {"hyperparameters": {"units": 4}, "entrypoint": "python3 train.py"}

#: Nine levels of nine aliases each: 9**9 (387 million) strings once expanded.
ALIAS_BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} ["
        + ",".join([f"*{chr(ord('a') + i - 1)}"] * 9)
        + "]"
        for i in range(1, 9)
    ]
    + ["data: {bomb: *i}", "entrypoint: python3 train.py"]
)


def _refused_quickly(action, match, *, seconds=10.0, megabytes=64):
    """``action()`` raises InvalidConfig matching ``match`` within the time and memory given."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(errors.InvalidConfig, match=match):
            action()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.1f} s"
    assert peak < megabytes * 2**20, f"peak {peak / 2**20:.0f} MB"


def _cli_create(tmp_path, config_text):
    path = tmp_path / "c.yaml"
    path.write_text(config_text)
    return CliRunner().invoke(
        cli,
        [
            "--storage",
            str(tmp_path / "st"),
            "--registry",
            f"sqlite:///{tmp_path / 'r.db'}",
            "experiment",
            "create",
            str(path),
            str(tmp_path),
        ],
    )


def test_yaml_alias_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    _refused_quickly(lambda: load_config(path), "too large")
    result = _cli_create(tmp_path, ALIAS_BOMB)
    assert result.exit_code == 2 and "too large" in result.output, result.output


def test_a_3000_deep_yaml_list_is_refused(tmp_path):
    text = "entrypoint: python3 train.py\ndata: {deep: " + "[" * 3000 + "]" * 3000 + "}\n"
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    _refused_quickly(lambda: load_config(path), "deeper than 64")
    assert _cli_create(tmp_path, text).exit_code == 2
    nested: list = []
    for _ in range(3000):  # the same through the Python API (a dict, no YAML)
        nested = [nested]
    _refused_quickly(lambda: parse_config({**SCRIPT, "data": {"deep": nested}}), "deeper")


def test_grid_size_is_a_product_not_an_enumeration():
    huge = {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 10**9}
    raw = {
        **SCRIPT,
        "hyperparameters": {"a": huge, "b": huge, "c": {"type": "int", "minval": 0, "maxval": 9}},
        "searcher": {"name": "grid", "metric": "val_loss"},
    }
    raw["hyperparameters"]["c"]["count"] = 10**12  # only 10 distinct integers
    _refused_quickly(lambda: parse_config(raw), r"the grid has 10{19} points")
    raw["hyperparameters"] = {"c": raw["hyperparameters"]["c"]}
    config = parse_config(raw)  # 10**12 points over 10 integers: a grid of 10
    assert config.searcher.max_trials == 10
    assert config.hyperparameters[0].grid_values() == list(range(10))


def test_a_huge_max_trials_is_refused(tmp_path):
    raw = {**SCRIPT, "searcher": {"name": "random", "metric": "val_loss", "max_trials": 10**12}}
    _refused_quickly(lambda: parse_config(raw), r"`searcher.max_trials`.*1000000000000")
    text = (
        "entrypoint: python3 train.py\nsearcher: {name: random, metric: m, max_trials: 10000000}\n"
    )
    assert _cli_create(tmp_path, text).exit_code == 2


def test_an_unbalanced_quote_in_the_entrypoint_is_refused(tmp_path):
    _refused_quickly(
        lambda: parse_config({**SCRIPT, "entrypoint": "python3 'train.py"}),
        r"`entrypoint`: a shell cannot split",
    )
    result = _cli_create(tmp_path, "entrypoint: python3 'train.py\n")
    assert result.exit_code == 2 and "No closing quotation" in result.output, result.output
    assert not (tmp_path / "st").exists()  # nothing was recorded or started


def test_create_ends_when_a_trial_cannot_start(tmp_path):
    """A trial whose program is missing fails; `experiment create` exits non-zero naming it
    (it used to die with a traceback and never exit: the claim's heartbeat thread ran on)."""
    (tmp_path / "c.yaml").write_text(
        "hyperparameters: {units: 4}\nsearcher: {name: single, metric: val_loss}\n"
        "entrypoint: ./no-such-program train.py\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    registry = f"sqlite:///{tmp_path / 'r.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", "--storage", str(tmp_path / "st")]
        + ["--registry", registry, "experiment", "create", "c.yaml", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Trial 1 ERROR" in proc.stderr and "no-such-program" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    info = describe_experiment(1, registry=registry)
    assert info["state"] == "ERROR" and [t["state"] for t in info["trials"]] == ["ERROR"]


def test_python_api_create_fails_the_trial_not_the_runner(tmp_path):
    raw = {**SCRIPT, "entrypoint": "./no-such-program"}
    registry = f"sqlite:///{tmp_path / 'r.db'}"
    exp_id = create_experiment(raw, tmp_path, storage=str(tmp_path / "st"), registry=registry)
    assert describe_experiment(exp_id, registry=registry)["state"] == "ERROR"
