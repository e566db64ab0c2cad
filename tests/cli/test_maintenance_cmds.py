"""`ckptstore gc`, `reindex` and `storage validate`."""

from __future__ import annotations

import os

from ckptstore.cli.errors import EXIT_BAD_INPUT, EXIT_STORAGE
from tests.cli.helpers import Env


def test_gc_dry_run_then_delete_keeps_latest_and_model_versions(env):
    uuids = [env.save(1, steps) for steps in (10, 20, 30, 40)]
    other = env.save(2, 5)
    env.run("model", "create", "m")
    assert env.run("model", "register-version", "m", uuids[0]).exit_code == 0

    # Issue 15: without a metric, best rules keep every checkpoint, and gc needs --yes (these
    # calls used to be plain `gc`, which then deleted the best checkpoint unasked).
    no_best = ("--save-trial-best", "0")
    dry = env.json("gc", "--dry-run", *no_best)
    assert dry["dry_run"] is True and sorted(dry["deleted"]) == sorted(uuids[1:3])
    assert len(env.json("checkpoint", "list")) == 5  # nothing deleted by a dry run
    assert all(os.path.isdir(os.path.join(env.storage_url, u)) for u in uuids)

    result = env.run("gc", "--yes", *no_best)
    assert result.exit_code == 0, result.output
    assert "Deleted 2 checkpoint(s)." in result.stdout
    left = {r["uuid"] for r in env.json("checkpoint", "list")}
    assert left == {uuids[0], uuids[3], other}  # model version, trial 1 latest, trial 2 latest
    assert not os.path.exists(os.path.join(env.storage_url, uuids[1], "model.keras"))
    assert env.json("gc", "--yes", *no_best)["deleted"] == []  # idempotent


def test_gc_by_metric_for_one_trial(env):
    best = env.save(1, 10, metrics={"val_loss": 0.1})
    env.save(1, 20, metrics={"val_loss": 0.9})
    latest = env.save(1, 30, metrics={"val_loss": 0.5})
    other = [env.save(2, s) for s in (1, 2)]
    result = env.json("gc", "--trial", "1", "--metric", "val_loss", "--yes")
    assert len(result["deleted"]) == 1
    left = {r["uuid"] for r in env.json("checkpoint", "list")}
    assert left == {best, latest, *other}
    assert env.run("gc", "--save-trial-latest", "-1", "--yes").exit_code == EXIT_BAD_INPUT


def test_reindex_rebuilds_a_fresh_registry(env, tmp_path):
    uuids = {
        env.save(t, s, experiment_id=3, metrics={"loss": s / 100})
        for t, s in ((1, 10), (1, 20), (2, 7))
    }
    fresh = Env(env.storage_url, f"sqlite:///{tmp_path / 'fresh.db'}", env.workdir)
    assert fresh.json("checkpoint", "list") == []
    assert fresh.json("reindex")["checkpoints"] == 3
    rebuilt = {r["uuid"]: r for r in fresh.json("checkpoint", "list")}
    original = {r["uuid"]: r for r in env.json("checkpoint", "list")}
    assert set(rebuilt) == uuids
    for uuid in uuids:
        for key in ("trial_id", "experiment_id", "steps_completed", "state", "metrics", "files"):
            assert rebuilt[uuid][key] == original[uuid][key], key
    assert "Indexed 3 checkpoint(s)" in fresh.run("reindex").stdout


def test_storage_validate(env, tmp_path):
    ok = env.run("storage", "validate")
    assert ok.exit_code == 0 and "OK" in ok.stdout
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    bad = env.run("--storage", str(blocker / "sub"), "storage", "validate")
    assert bad.exit_code == EXIT_STORAGE, bad.output
    assert "Error:" in bad.output
