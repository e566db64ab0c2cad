"""The Optuna searcher: sampling per hyperparameter type, ASHA pruning, and study storage on
SQLite and on the registry's PostgreSQL database."""

import pytest

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
