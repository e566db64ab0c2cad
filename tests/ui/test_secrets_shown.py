"""Issue 27, finding 4: a secret planted anywhere in an experiment's config or a trial's
hparams never appears in the UI's pages, the HTML report or ``--json`` output (one masking
rule, :mod:`ckptstore.masking`, behind all of them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from ckptstore.reports import collect_experiment_report, render_report
from ckptstore.ui.app import create_app
from tests.ui.conftest import UiEnv

_NAMES = st.sampled_from(["lr", "layers", "data", "opts", "url", "env", "notes", "x1", "batch"])
_LEAVES = st.one_of(st.integers(-5, 5), st.floats(0, 1), st.text("abcxyz -_", max_size=8))
_TREES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_NAMES, inner, max_size=3)
    ),
    max_leaves=8,
)
_SECRET_KEYS = st.sampled_from(
    [
        "password",
        "db_password",
        "api_key",
        "wandb_api_key",
        "ssh_private_key",
        "Authorization",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "client_secret",
        "accessToken",
    ]
)
#: The shapes a secret takes in configs: under a key, as ``NAME=value`` (Determined's
#: ``environment_variables``), in a URL's user-info or query, in a header line.
_PLANTS = [
    lambda key, s: {key: s},
    lambda key, s: {"Authorization": f"Bearer {s}"},
    lambda key, s: [f"{key.upper()}={s}"],
    lambda key, s: [f"{key.upper()}={s} and more words"],
    lambda key, s: f"postgresql://me:{s}@db.example:5432/ckpts",
    lambda key, s: f"https://h.example/p?a=1&{key}={s}&b=2",
    lambda key, s: f"https://acct.blob.example/c?sv=2024&sig={s}",
    lambda key, s: f"Authorization: Bearer {s}",
]


def _plant(tree: Any, path: list[int], value: Any) -> Any:
    """``tree`` with ``value`` added at the container ``path`` leads to (or beside a leaf)."""
    if isinstance(tree, dict) and tree and path:
        key = sorted(tree)[path[0] % len(tree)]
        return {**tree, key: _plant(tree[key], path[1:], value)}
    if isinstance(tree, list) and tree and path:
        i = path[0] % len(tree)
        return [*tree[:i], _plant(tree[i], path[1:], value), *tree[i + 1 :]]
    if isinstance(tree, dict):
        return {**tree, "planted": value}
    if isinstance(tree, list):
        return [*tree, value]
    return {"leaf": tree, "planted": value}


@pytest.fixture(scope="module")
def shared_client(shared_ui_env: UiEnv) -> Iterator[TestClient]:
    with TestClient(create_app(shared_ui_env.settings())) as client:
        yield client


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    tree=_TREES,
    path=st.lists(st.integers(0, 5), max_size=4),
    key=_SECRET_KEYS,
    plant=st.sampled_from(range(len(_PLANTS))),
    secret=st.text(
        "ABCDEFGHJKMNPQRSTUVWXYZabcdefghjkmnpqrstuvwxyz23456789", min_size=6, max_size=16
    ),
    where=st.sampled_from(["config", "hparams"]),
)
def test_a_planted_secret_never_shows(
    shared_ui_env, shared_client, tree, path, key, plant, secret, where
):
    secret = "Zq" + secret  # never part of the page's own text
    planted = _plant(tree, path, _PLANTS[plant](key, secret))
    env = shared_ui_env.env
    config = {
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "hyperparameters": {},
        "environment": {"environment_variables": ["SEED=1"]},
    }
    if where == "config":
        config["data"] = planted
    with env.registry() as registry:
        exp = registry.create_experiment("planted", config=config)
        trial = registry.create_trial(
            experiment_id=exp, hparams={"lr": 0.1, "p": planted if where == "hparams" else 1}
        )
        report = render_report(collect_experiment_report(registry, exp))
    shown = {
        "experiment page": shared_client.get(f"/experiments/{exp}").text,
        "experiments list": shared_client.get("/experiments").text,
        "trial page": shared_client.get(f"/trials/{trial}").text,
        "report": report,
        "experiment describe --json": env.run("experiment", "describe", str(exp), "--json").output,
        "trial describe --json": env.run("trial", "describe", str(trial), "--json").output,
        "trial list --json": env.run("trial", "list", "--experiment", str(exp), "--json").output,
    }
    assert json.loads(shown["trial describe --json"])["id"] == trial  # real output, not an error
    for what, text in shown.items():
        assert secret not in text, (what, planted)


def test_environment_variables_show_names_only(shared_ui_env, shared_client):
    """Every value of ``environment.environment_variables`` is hidden (issue 29), also under a
    name that does not look secret: the trials receive them as their environment."""
    value = "db.internal;svc;plainvalue123"  # no URL password or secret name to go by
    config = {
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "environment": {"environment_variables": [f"DATABASE_URL={value}", "SEED=7"]},
    }
    with shared_ui_env.env.registry() as registry:
        exp = registry.create_experiment("env vars", config=config)
        report = render_report(collect_experiment_report(registry, exp))
    page = shared_client.get(f"/experiments/{exp}").text
    for text in (page, report):
        assert "plainvalue123" not in text and "SEED=7" not in text
    assert "DATABASE_URL=***" in page and "SEED=***" in page
