"""Issue 39 ("the first hour"): the CLI as a newcomer meets it. Each test fails on the code
before the issue: `ckptstore run` without --trial-id, `trial delete`, UUID prefixes, the
storage column and filter of `checkpoint list`, a signed checkpoint's file sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore.registry import Registry
from tests._helpers.fresh_home import fresh_home_env
from tests.cli.helpers import make_env


def test_run_without_a_trial_id_runs_the_script_as_a_new_trial(tmp_path):
    """Finding 3: `ckptstore run -- python3 train.py` gave the script get_cluster_info() None
    (AttributeError) and left an ERROR trial; now every run is a new trial."""
    (tmp_path / "train.py").write_text(
        "import determined as det\n"
        "info = det.get_cluster_info()\n"
        "with det.core.init() as ctx:\n"
        "    assert ctx.info.trial.trial_id == info.trial.trial_id\n"
        "    print('trial', info.trial.trial_id)\n"
    )
    command = [sys.executable, "-m", "ckptstore.cli.main", "run", "--", "python3", "train.py"]
    seen = []
    for _ in range(2):
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=fresh_home_env(tmp_path / "home"),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen.append(done.stdout.split()[-1])
        assert f"--trial-id {seen[-1]}" in done.stderr  # says how to resume that run
    assert seen == ["1", "2"]
    with Registry(f"sqlite:///{tmp_path / 'home' / 'registry.db'}") as registry:
        assert [t.state for t in registry.list_trials()] == ["COMPLETED", "COMPLETED"]


def test_trial_delete_removes_its_checkpoints_and_asks_for_yes(tmp_path):
    env = make_env(tmp_path)
    kept = env.save(2, 1)
    gone = [env.save(1, steps) for steps in (1, 2)]
    refused = env.run("trial", "delete", "1")
    assert refused.exit_code == 2 and "--yes" in refused.output
    assert len(env.json("checkpoint", "list", "--trial", "1")) == 2  # nothing deleted
    done = env.run("trial", "delete", "1", "--yes")
    assert done.exit_code == 0, done.output
    assert [t["id"] for t in env.json("trial", "list")] == [2]
    assert [c["uuid"] for c in env.json("checkpoint", "list", "--all")] == [kept]
    for uuid in gone:
        # Only the tombstone stays (a writer waking up late cannot commit there again).
        assert os.listdir(Path(env.storage_url) / uuid) == ["MANIFEST.json"]
    assert (Path(env.storage_url) / kept).exists()
    assert env.run("trial", "delete", "1", "--yes").exit_code == 3  # no such trial


def test_trial_delete_refuses_a_trial_holding_a_model_version(tmp_path):
    env = make_env(tmp_path)
    uuid = env.save(1, 1)
    assert env.run("model", "create", "m").exit_code == 0
    assert env.run("model", "register-version", "m", uuid).exit_code == 0
    refused = env.run("trial", "delete", "1", "--yes")
    assert refused.exit_code == 2 and "model version" in refused.output
    assert (Path(env.storage_url) / uuid).exists()


def test_a_unique_uuid_prefix_of_8_characters_names_the_checkpoint(tmp_path):
    env = make_env(tmp_path)
    uuids = [env.save(1, steps) for steps in (1, 2, 3)]
    prefix = uuids[1][:8]
    assert env.json("checkpoint", "describe", prefix)["uuid"] == uuids[1]
    assert env.run("checkpoint", "verify", prefix).exit_code == 0
    out = tmp_path / "dl"
    assert env.run("checkpoint", "download", prefix, "-o", str(out)).exit_code == 0
    assert (out / "model.keras").exists()
    too_short = env.run("checkpoint", "describe", uuids[1][:7])
    assert too_short.exit_code == 3, too_short.output
    with Registry(env.registry_url) as registry:  # two rows sharing a prefix: named, refused
        record = registry.get_checkpoint(uuids[0]).to_record()
        record.uuid = prefix + "-0000-4000-8000-000000000000"
        registry.record_checkpoint(record)
    ambiguous = env.run("checkpoint", "describe", prefix)
    assert ambiguous.exit_code == 2 and "several" in ambiguous.output


def test_checkpoint_list_shows_and_filters_by_storage(tmp_path):
    """Finding 6: --storage listed every storage's checkpoints, with no storage column."""
    here, there = make_env(tmp_path), make_env(tmp_path, str(tmp_path / "other"))
    mine, theirs = here.save(1, 1), there.save(2, 1)
    listed = here.json("checkpoint", "list")
    assert [c["uuid"] for c in listed] == [mine]
    assert listed[0]["storage_url"] == f"file://{tmp_path / 'store'}"
    assert [c["uuid"] for c in there.json("checkpoint", "list")] == [theirs]
    table = here.run("checkpoint", "list").output
    assert "Storage" in table.splitlines()[0] and "file:///" in table  # long URLs cut


def test_a_signed_checkpoints_sizes_stay_numbers(tmp_path):
    """Finding 4: the file name model.sig was taken for a secret and its size shown as ***."""
    env = make_env(tmp_path)
    uuid = env.save(1, 1, files={"model.keras": b"k" * 10, "model.sig": b"s" * 7})
    described = env.json("checkpoint", "describe", uuid)
    assert described["resources"]["model.sig"] == 7
    assert described["size_bytes"] == sum(described["resources"].values())


@pytest.mark.parametrize("protocol", ["http://169.254.169.254/x", "/etc/elsewhere"])
def test_download_never_follows_a_row_to_a_host_or_a_local_path(tmp_path, monkeypatch, protocol):
    """The trust rule still holds for downloads: a row naming HTTP or a local path outside the
    storages this process knows is refused (exit 2), whatever it says."""
    env = make_env(tmp_path)
    uuid = env.save(1, 1)
    with Registry(env.registry_url) as registry:
        record = registry.get_checkpoint(uuid).to_record()
        record.storage_url = protocol
        registry.record_checkpoint(record)
    monkeypatch.delenv("CKPTSTORE_STORAGE", raising=False)
    monkeypatch.delenv("CKPTSTORE_ALLOWED_STORAGE", raising=False)
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path / "home"))
    from click.testing import CliRunner

    from ckptstore.cli.main import cli

    args = ["--registry", env.registry_url, "checkpoint", "download", uuid, "-o", str(tmp_path)]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2 and "StorageNotAllowed" in refused.output


def test_an_abandoned_pending_row_is_shown_as_such_and_cleaned_by_gc(tmp_path):
    """Finding 5: a PENDING row left by a dead upload stayed for ever, shown as any other."""
    import datetime as dt

    env = make_env(tmp_path)
    uuid = env.save(1, 1)
    with Registry(env.registry_url) as registry:
        record = registry.get_checkpoint(uuid).to_record()
        record.uuid = "0b7c2f11-0000-4000-8000-000000000001"  # its process died before commit
        record.state = "PENDING"
        record.created_at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)
        registry.record_checkpoint(record)
    listed = {c["uuid"]: c for c in env.json("checkpoint", "list", "--all")}
    assert listed[record.uuid]["abandoned"] is True and "abandoned" not in listed[uuid]
    assert "PENDING (abandoned" in env.run("checkpoint", "list", "--all").output
    cleaned = env.run("gc", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    states = {c["uuid"]: c["state"] for c in env.json("checkpoint", "list", "--all")}
    assert states == {uuid: "COMMITTED", record.uuid: "DELETED"}
