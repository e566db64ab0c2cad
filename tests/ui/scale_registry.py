"""A registry of 1,000 trials and 100,000 checkpoints, built with bulk SQL inserts in seconds.

Used by the UI's scale tests and by ``benchmarks/ui_pages.py``. The rows look like what runs
write (metrics nested the way DeterminedCallback reports them, GC-deleted checkpoints beside
committed ones, model versions on some checkpoints) but no checkpoint has files in storage.

Example::

    from tests.ui.scale_registry import build_scale_registry

    counts = build_scale_registry("sqlite:////tmp/big.db")
    print(counts)  # {'experiments': 11, 'trials': 1000, 'checkpoints': 100000, ...}
"""

from __future__ import annotations

import datetime as _dt
import math
import random
import uuid as _uuid

import sqlalchemy as sa

from ckptstore.registry import Registry, schema

SMALL_EXPERIMENTS = 10


def _config(name: str, max_trials: int) -> dict:
    return {
        "name": name,
        "searcher": {
            "name": "adaptive_asha",
            "metric": "val_loss",
            "smaller_is_better": True,
            "max_trials": max_trials,
        },
        "hyperparameters": {
            "learning_rate": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
            "dense_units": {"type": "int", "minval": 16, "maxval": 256},
            "optimizer": {"type": "categorical", "vals": ["adam", "sgd"]},
        },
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/tmp", "save_trial_best": 1},
    }


def build_scale_registry(
    url: str,
    *,
    trials: int = 1000,
    checkpoints_per_trial: int = 100,
    metric_rows_per_trial: int = 20,
    models: int = 20,
    seed: int = 0,
    script_runs: int = 0,
) -> dict[str, int]:
    """Fill the (new, empty) registry at ``url``; returns the row counts written.
    ``script_runs`` more trials belong to no experiment (what ``/`` lists)."""
    Registry(url).close()  # create / migrate the schema
    rng = random.Random(seed)
    engine = sa.create_engine(url)
    now = schema.utcnow()
    small = SMALL_EXPERIMENTS if trials >= 200 else 0
    per_small = 10
    big = trials - small * per_small
    experiments, trial_rows, ckpt_rows, metric_rows = [], [], [], []
    trial_id = 0
    plan: list[tuple[int | None, int]] = [
        (exp_id, big if exp_id == 1 else per_small) for exp_id in range(1, small + 2)
    ]
    for exp_id, n in plan + [(None, script_runs)]:
        if exp_id is not None:
            experiments.append(
                {
                    "id": exp_id,
                    "name": f"search-{exp_id}",
                    "config": _config(f"search-{exp_id}", n),
                    "description": None,
                    "state": "COMPLETED" if exp_id > 1 else "ACTIVE",
                    "created_at": now,
                    "updated_at": now,
                }
            )
        for _ in range(n):
            trial_id += 1
            lr = 10 ** rng.uniform(-4, -1)
            units = rng.randint(16, 256)
            quality = abs(math.log10(lr) + 2.5) + rng.random() * 0.3
            trial_rows.append(
                {
                    "id": trial_id,
                    "experiment_id": exp_id,
                    "hparams": {
                        "learning_rate": lr,
                        "dense_units": units,
                        "optimizer": rng.choice(["adam", "sgd"]),
                    },
                    "state": rng.choice(["COMPLETED"] * 8 + ["ERROR", "ACTIVE"]),
                    "created_at": now,
                    "updated_at": now,
                }
            )
            for i in range(metric_rows_per_trial):
                steps = (i + 1) * 100
                loss = quality + 1.0 / (i + 1)
                group = "training" if i % 2 == 0 else "validation"
                values = {"loss": loss} if group == "training" else {"val_loss": loss * 1.1}
                metric_rows.append(
                    {
                        "trial_id": trial_id,
                        "group": group,
                        "steps_completed": steps,
                        "metrics": values,
                        "reported_at": now,
                    }
                )
            for i in range(checkpoints_per_trial):
                steps = (i + 1) * 10
                state = "COMMITTED" if i >= checkpoints_per_trial - 3 else "DELETED"
                ckpt_rows.append(
                    {
                        "uuid": str(_uuid.UUID(int=rng.getrandbits(128), version=4)),
                        "trial_id": trial_id,
                        "experiment_id": exp_id,
                        "steps_completed": steps,
                        "continue_id": trial_id,
                        "state": state,
                        "metadata": {"epoch": i, "steps_completed": steps},
                        "metrics": {
                            "validation_metrics": {"val_loss": quality + 1.0 / (i + 1)},
                            "training_metrics": {"loss": quality + 0.9 / (i + 1)},
                        },
                        "resources": {"model.keras": 1_000_000 + i, "callback_state.json": 512}
                        if state == "COMMITTED"
                        else {},
                        "storage_url": "file:///tmp/ckptstore-scale",
                        "created_at": now + _dt.timedelta(seconds=trial_id * 1000 + i),
                        "updated_at": now,
                    }
                )
    committed = [c["uuid"] for c in ckpt_rows if c["state"] == "COMMITTED"]
    model_rows, version_rows, alias_rows = [], [], []
    version_id = 0
    for m in range(1, models + 1):
        model_rows.append(
            {
                "id": m,
                "name": f"model-{m:03d}",
                "description": "",
                "labels": ["scale"],
                "metadata": {},
                "archived": False,
                "last_version": 5,
                "created_at": now,
                "updated_at": now,
            }
        )
        for v in range(1, 6):
            version_id += 1
            version_rows.append(
                {
                    "id": version_id,
                    "model_id": m,
                    "version": v,
                    "checkpoint_uuid": committed[(m * 7 + v) % len(committed)],
                    "notes": "",
                    "created_at": now,
                }
            )
        alias_rows.append({"model_id": m, "alias": "production", "version_id": version_id})
    with engine.begin() as conn:
        for table, rows in (
            (schema.experiments, experiments),
            (schema.trials, trial_rows),
            (schema.checkpoints, ckpt_rows),
            (schema.metrics, metric_rows),
            (schema.models, model_rows),
            (schema.model_versions, version_rows),
            (schema.model_aliases, alias_rows),
        ):
            if rows:
                conn.execute(table.insert(), rows)
        if engine.dialect.name == "postgresql":
            for table in (schema.experiments, schema.trials, schema.models, schema.model_versions):
                conn.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                        f"(SELECT MAX(id) FROM {table.name}))"
                    )
                )
    engine.dispose()
    return {
        "experiments": len(experiments),
        "trials": len(trial_rows),
        "checkpoints": len(ckpt_rows),
        "metrics": len(metric_rows),
        "models": len(model_rows),
        "model_versions": len(version_rows),
    }
