"""The Optuna searcher: sampling per hyperparameter type, ASHA pruning, and study storage on
SQLite and on the registry's PostgreSQL database."""

import sys
import textwrap

import pytest
import yaml

from ckptstore.experiment import create_experiment, describe_experiment
from ckptstore.experiment.config import parse_config
from ckptstore.experiment.searcher import Searcher, optuna_storage_url
from ckptstore.registry import Registry


def config(name="random", **searcher):
    return parse_config(
        {
            "hyperparameters": {
                "global_batch_size": 8,
                "lr": {"type": "log", "minval": -4, "maxval": -1},
                "units": {"type": "int", "minval": 4, "maxval": 32},
                "drop": {"type": "double", "minval": 0.0, "maxval": 0.5},
                "act": {"type": "categorical", "vals": ["relu", "tanh"]},
                "layers": {"type": "categorical", "vals": [[8], [8, 8]]},
                "opt": {"beta": 0.9},
            },
            "searcher": {
                "name": name,
                "metric": "val_loss",
                "max_length": {"batches": 64},
                "max_trials": 8,
                **searcher,
            },
            "entrypoint": "model_def:Trial",
        }
    )


def test_samples_respect_each_type(tmp_path):
    searcher = Searcher(config(), 1, f"sqlite:///{tmp_path / 'reg.db'}")
    assert (tmp_path / "reg.optuna.db").exists()
    for _ in range(5):
        hp, _ = searcher.ask()
        assert hp["global_batch_size"] == 8 and hp["opt"] == {"beta": 0.9}
        assert 1e-4 <= hp["lr"] <= 1e-1
        assert 4 <= hp["units"] <= 32 and isinstance(hp["units"], int)
        assert 0.0 <= hp["drop"] <= 0.5
        assert hp["act"] in ("relu", "tanh") and hp["layers"] in ([8], [8, 8])


# A Core API script that trains nothing: it reports the learning rate it was given.
REPORT_LR_PY = """
import ckptstore as det

with det.core.init() as core_context:
    lr = core_context.info.trial.hparams["lr"]
    core_context.train.report_validation_metrics(1, {"val_loss": lr})
"""


def _search_yaml(tmp_path, name, **extra):
    raw = {
        "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_length": {"batches": 1},
            "max_trials": 2,
        },
        "entrypoint": f"{sys.executable} train.py",
        **extra,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.e2e  # two trial processes per experiment
def test_a_set_experiment_seed_repeats_the_search_in_a_new_experiment(tmp_path, where):
    """Determined seeds its searcher with ``reproducibility.experiment_seed``: two experiments
    created from one YAML that sets it draw the same hyperparameters. Without it each
    experiment draws its own (the seed is then its ID)."""
    storage, registry = where
    (tmp_path / "train.py").write_text(textwrap.dedent(REPORT_LR_PY))
    seeded = _search_yaml(tmp_path, "seeded.yaml", reproducibility={"experiment_seed": 7})
    unseeded = _search_yaml(tmp_path, "unseeded.yaml")

    def draws(path):
        exp_id = create_experiment(path, tmp_path, storage=storage, registry=registry)
        trials = describe_experiment(exp_id, registry=registry)["trials"]
        assert [t["state"] for t in trials] == ["COMPLETED", "COMPLETED"], trials
        return [t["hparams"]["lr"] for t in sorted(trials, key=lambda t: t["id"])]

    first, second = draws(seeded), draws(seeded)
    assert first == second and first[0] != first[1]
    assert draws(unseeded) != draws(unseeded)


def test_only_a_seed_the_config_sets_is_taken_alone(tmp_path):
    """``experiment_seed: 0`` written in the config is a seed; the default 0 is not (each
    experiment's ID seeds then)."""
    url = f"sqlite:///{tmp_path / 'reg.db'}"

    def lrs(cfg, exp_id):
        searcher = Searcher(cfg, exp_id, url)
        return [searcher.ask()[0]["lr"] for _ in range(3)]

    zero = parse_config({**config().raw, "reproducibility": {"experiment_seed": 0}})
    assert lrs(zero, 3) == lrs(zero, 4)
    empty = parse_config({**config().raw, "reproducibility": {}})
    assert lrs(empty, 5) != lrs(empty, 6)


def test_adaptive_asha_prunes_the_worse_trials(tmp_path):
    searcher = Searcher(
        config("adaptive_asha", max_rungs=3, divisor=2), 1, f"sqlite:///{tmp_path / 'r.db'}"
    )
    ids = [searcher.ask()[1] for _ in range(6)]
    pruned = []
    # min resource 64 / 2**2 = 16 batches: report at batch 16, better trials first
    for i, optuna_id in enumerate(ids):
        pruned.append(searcher.should_prune(optuna_id, 16, float(i)))
    assert not pruned[0] and any(pruned[3:])
    assert all(searcher.is_finished(i) for i, p in zip(ids, pruned, strict=True) if p)


def test_links_survive_reopening(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    searcher = Searcher(config(), 7, url)
    _, optuna_id = searcher.ask()
    searcher.link(optuna_id, 42)
    again = Searcher(config(), 7, url)
    assert again.optuna_ids() == {42: optuna_id}
    assert not again.is_finished(optuna_id)
    again.tell(optuna_id, 0.5)
    assert again.study.best_value == 0.5


def test_postgresql_registry_hosts_the_study(postgres_url_factory):
    url = postgres_url_factory()
    with Registry(url) as registry:
        exp_id = registry.create_experiment("pg")
        searcher = Searcher(config(), exp_id, url)
        _, optuna_id = searcher.ask()
        searcher.link(optuna_id, 1)
        searcher.tell(optuna_id, 1.5)
        assert registry.get_experiment(exp_id).name == "pg"  # registry tables untouched
    optuna_url, kwargs = optuna_storage_url(url)
    assert optuna_url.startswith("postgresql+psycopg://")
    assert "search_path=optuna" in kwargs["connect_args"]["options"]
    assert Searcher(config(), exp_id, url).study.best_value == 1.5


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_registry_gets_a_file_study(url, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path))
    optuna_url, _ = optuna_storage_url(url)
    assert optuna_url == f"sqlite:///{tmp_path / 'optuna' / 'studies.db'}"
