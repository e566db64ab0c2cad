"""Issue 15 items 3, 4 and 7 through the command line: an explicit --storage wins over the URL a
registry row recorded, mistyped storage URLs are refused, and gc never deletes a checkpoint a
best rule could protect, nor anything without --yes or a confirmed dry run on a terminal."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ckptstore import errors
from ckptstore.cli.errors import EXIT_BAD_INPUT, EXIT_CORRUPT
from ckptstore.cli.main import cli
from ckptstore.core import init
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.cli.helpers import Env

MISTYPED = ["s3:/bucket", "gs:bucket/x", "", "   ", " /tmp/x", "az:/c/p"]


@pytest.mark.parametrize("spec", MISTYPED)
def test_mistyped_storage_is_refused_everywhere(tmp_path, spec, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.InvalidStorageConfig, match="Received|mistyped"):
        open_storage(spec)
    with pytest.raises(errors.InvalidStorageConfig):
        with init(storage=spec, registry=f"sqlite:///{tmp_path}/r.db", trial_id=1):
            pass
    result = CliRunner().invoke(
        cli, ["--storage", spec, "--registry", f"sqlite:///{tmp_path}/r.db", "checkpoint", "list"]
    )
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    # a usage error raised while --storage is parsed, before any verb runs, with the typed message
    assert "Invalid value for '--storage': InvalidStorageConfig: " in result.output
    assert os.listdir(tmp_path) == []  # no ./s3:/bucket folder, no registry created


@pytest.mark.parametrize(
    "spec, why",
    [
        ('{"type": "s3"}', "missing the required key 'bucket'"),
        ('{"type": "floppy", "path": "/x"}', "floppy"),
        ('{"type": "directory", "container_path": "/x", "save_trial_best": -1}', "save_trial_best"),
        ('{"type": ', "must be a JSON checkpoint_storage object"),
    ],
)
def test_a_bad_storage_object_in_the_environment_is_a_usage_error(tmp_path, spec, why):
    """CKPTSTORE_STORAGE may hold a checkpoint_storage object (as a child process gets it): the
    CLI parses it with the same resolve() as the library; a bad one is exit 2, typed, early."""
    result = CliRunner().invoke(
        cli,
        ["--registry", f"sqlite:///{tmp_path}/r.db", "storage", "validate"],
        env={"CKPTSTORE_STORAGE": spec},
    )
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "Invalid value for '--storage': InvalidStorageConfig: " in result.output
    assert why in result.output
    assert os.listdir(tmp_path) == []


def test_a_storage_object_reaches_the_verb_parsed(tmp_path):
    """A checkpoint_storage object given to --storage opens the folder it names (before, the
    JSON text became a local folder's name)."""
    block = f'{{"type": "directory", "container_path": "{tmp_path}/ckpts", "save_trial_best": 1}}'
    result = CliRunner().invoke(
        cli, ["--storage", block, "--registry", f"sqlite:///{tmp_path}/r.db", "storage", "validate"]
    )
    assert result.exit_code == 0, result.output
    assert f"OK: file://{tmp_path}/ckpts can be written" in result.output
    assert sorted(os.listdir(tmp_path)) == ["ckpts"]


def test_file_urls_and_colon_folders_still_work(tmp_path):
    assert open_storage(f"file:{tmp_path}/a").local_path("") == f"{tmp_path}/a"
    assert open_storage(f"{tmp_path}/x:y").local_path("") == f"{tmp_path}/x:y"


def test_explicit_storage_wins_over_the_recorded_url(tmp_path, caplog):
    """Item 3: verify/download with --storage OTHER use OTHER (a damaged copy fails), and the
    command says that the registry recorded another URL."""
    env = Env(str(tmp_path / "a"), f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    uuid = env.save(1, 10)
    other = tmp_path / "b"
    shutil.copytree(tmp_path / "a", other)
    explicit = Env(str(other), env.registry_url, str(tmp_path))
    explicit.corrupt(uuid, "model.keras")
    assert env.run("checkpoint", "verify", uuid).exit_code == 0  # the recorded, intact copy
    result = explicit.run("checkpoint", "verify", uuid)
    assert result.exit_code == EXIT_CORRUPT, result.output
    assert "model.keras" in result.output
    assert "registry recorded it in" in caplog.text
    out = tmp_path / "dl"
    assert explicit.run("checkpoint", "download", uuid, "-o", str(out)).exit_code == EXIT_CORRUPT


def _env_with_best(tmp_path) -> tuple[Env, str, str]:
    env = Env(str(tmp_path / "s"), f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    best = env.save(1, 10, metrics={"val_loss": 0.1})
    env.save(1, 20, metrics={"val_loss": 0.9})
    latest = env.save(1, 30, metrics={"val_loss": 0.5})
    return env, best, latest


def test_gc_without_a_metric_keeps_every_checkpoint_and_says_so(tmp_path, caplog):
    env, best, _latest = _env_with_best(tmp_path)
    result = env.run("gc", "--yes")
    assert result.exit_code == 0, result.output
    assert "Deleted 0 checkpoint(s)." in result.stdout
    assert "no metric is known" in caplog.text  # a WARNING log line: stderr of the command
    assert best in {r["uuid"] for r in env.json("checkpoint", "list")}


def test_gc_says_once_that_no_metric_is_known(tmp_path, caplog):
    """A first-hour store holds many script runs: gc said the same warning once per trial, and
    also for trials with no checkpoint in the storage it was given."""
    env, _best, _latest = _env_with_best(tmp_path)
    env.save(2, 10)
    env.save(2, 20)
    with Registry(env.registry_url) as reg:
        reg.ensure_trial(3)  # no checkpoint anywhere: nothing to rank, nothing to say
    result = env.run("gc", "--dry-run")
    assert result.exit_code == 0, result.output
    assert caplog.text.count("no metric is known") == 1, caplog.text
    caplog.clear()
    assert env.run("gc", "--dry-run", "--trial", "3").exit_code == 0
    assert "no metric is known" not in caplog.text


def test_gc_uses_the_searcher_metric_recorded_for_the_experiment(tmp_path):
    env = Env(str(tmp_path / "s"), f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    with Registry(env.registry_url) as reg:
        exp = reg.create_experiment(
            config={"searcher": {"metric": "accuracy", "smaller_is_better": False}}
        )
        reg.ensure_trial(1, experiment_id=exp)
    best = env.save(1, 10, experiment_id=exp, metrics={"val_accuracy": 0.9})  # val_ alias
    env.save(1, 20, experiment_id=exp, metrics={"val_accuracy": 0.2})
    latest = env.save(1, 30, experiment_id=exp, metrics={"val_accuracy": 0.5})
    assert env.json("gc", "--yes")["deleted"] != []
    assert {r["uuid"] for r in env.json("checkpoint", "list")} == {best, latest}


def test_gc_refuses_to_delete_without_yes_off_a_terminal(tmp_path):
    env, _best, _latest = _env_with_best(tmp_path)
    result = env.run("gc", "--metric", "val_loss")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "--dry-run" in result.output and "--yes" in result.output
    assert len(env.json("checkpoint", "list")) == 3


@pytest.mark.parametrize("answer, left", [(b"n\n", 3), (b"y\n", 2)])
def test_gc_on_a_terminal_shows_a_dry_run_and_asks(tmp_path, answer, left):
    env, _best, _latest = _env_with_best(tmp_path)
    main, child = pty.openpty()
    argv = [sys.executable, "-m", "ckptstore.cli.main", "--storage", env.storage_url,
            "--registry", env.registry_url, "gc", "--metric", "val_loss"]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=child, stdout=child, stderr=child, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    os.close(child)
    seen = b""
    while b"Delete these 1 checkpoint(s)?" not in seen:
        chunk = os.read(main, 4096)
        assert chunk, seen
        seen += chunk
    assert b"Would delete" in seen
    os.write(main, answer)
    assert proc.wait(timeout=60) == (0 if answer.startswith(b"y") else 1)
    os.close(main)
    assert len(env.json("checkpoint", "list")) == left


def test_without_storage_a_row_url_is_read_only_when_allowed(tmp_path, monkeypatch):
    """Issue 27, finding 2: without --storage, the URL a registry row recorded is read when it
    is under the default storage or CKPTSTORE_ALLOWED_STORAGE; otherwise exit 2, saying how."""
    from ckptstore.checkpointing.row_storage import ALLOWED_STORAGE_ENV

    env = Env(str(tmp_path / "a"), f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    uuid = env.save(1, 10)
    for name in (ALLOWED_STORAGE_ENV, "CKPTSTORE_STORAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path / "home"))  # the default: elsewhere
    args = ["--registry", env.registry_url, "checkpoint", "download", uuid, "-o"]
    refused = CliRunner().invoke(cli, [*args, str(tmp_path / "no")])
    assert refused.exit_code == EXIT_BAD_INPUT, refused.output
    assert "StorageNotAllowed" in refused.output and ALLOWED_STORAGE_ENV in refused.output
    assert not (tmp_path / "no" / "model.keras").exists()
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, env.storage_url)
    allowed = CliRunner().invoke(cli, [*args, str(tmp_path / "yes")])
    assert allowed.exit_code == 0, allowed.output
    direct = env.run("checkpoint", "download", uuid, "-o", str(tmp_path / "direct"))
    assert direct.exit_code == 0, direct.output
    assert (tmp_path / "yes" / "model.keras").read_bytes() == (
        tmp_path / "direct" / "model.keras"
    ).read_bytes()
