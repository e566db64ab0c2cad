"""The command as a whole: help on every verb, exit codes, a real subprocess, no TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner

from ckptstore import errors
from ckptstore.cli.errors import exit_code_for
from ckptstore.cli.main import cli
from ckptstore.cli.progress import transfer_progress, wants_progress

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _walk(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _walk(
                command, click.Context(command, parent=ctx, info_name=name), (*path, name)
            )


def test_every_verb_has_help_with_an_example():
    ctx = click.Context(cli, info_name="ckptstore")
    paths = [p for p, _ in _walk(cli, ctx)]
    expected = {
        ("checkpoint", "list"), ("checkpoint", "describe"), ("checkpoint", "download"),
        ("checkpoint", "verify"), ("checkpoint", "delete"), ("trial", "list"),
        ("trial", "describe"), ("trial", "report"), ("model", "create"), ("model", "list"),
        ("model", "describe"), ("model", "register-version"), ("model", "set-alias"),
        ("model", "download"), ("gc",), ("reindex",), ("storage", "validate"),
        ("experiment", "report"), ("import-determined",), ("cache", "info"), ("cache", "clear"),
    }  # fmt: skip
    assert expected <= set(paths)
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Example" in result.output, path


def test_top_level_help_documents_exit_codes():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for line in ("2  bad input", "3  not found", "4  storage failure"):
        assert line in result.output


@pytest.mark.parametrize(
    "exc, code",
    [
        (errors.CheckpointNotFound("x"), 3),
        (errors.ModelNotFound("x"), 3),
        (errors.StorageNotFound("x"), 3),
        (errors.InvalidConfig("x"), 2),
        (errors.InvalidStoragePath("x"), 2),
        (errors.StorageUnavailable("x"), 4),
        (errors.StorageAuthError("x"), 4),
        (errors.ChecksumMismatch("x"), 5),
        (errors.RegistryError("x"), 1),
        (RuntimeError("x"), 1),
    ],
)
def test_exit_code_table(exc, code):
    assert exit_code_for(exc) == code


def test_no_progress_bar_when_not_a_terminal(capsys):
    assert not wants_progress()  # pytest captures stderr: not a TTY
    with transfer_progress("x", 100) as progress:
        assert progress is None
    with transfer_progress("x", 100, force=True) as progress:
        progress(60)
        progress(40)


def _subprocess_env(tmp_path):
    env = dict(os.environ)
    env["CKPTSTORE_STORAGE"] = str(tmp_path / "store")
    env["CKPTSTORE_REGISTRY"] = f"sqlite:///{tmp_path / 'reg.db'}"
    env["PYTHONPATH"] = ROOT
    return env


def test_real_subprocess_with_env_vars_and_exit_codes(env, tmp_path):
    uuid = env.save(4, 12)
    sub_env = _subprocess_env(tmp_path)
    sub_env["CKPTSTORE_STORAGE"], sub_env["CKPTSTORE_REGISTRY"] = env.storage_url, env.registry_url
    run = [sys.executable, "-m", "ckptstore.cli.main"]
    listed = subprocess.run(
        [*run, "checkpoint", "list", "--json"],
        env=sub_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["uuid"] for r in json.loads(listed.stdout)] == [uuid]
    missing = subprocess.run(
        [*run, "trial", "describe", "999"], env=sub_env, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 3 and "TrialNotFound" in missing.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", "checkpoint", "nope"],
        env=sub_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert usage.returncode == 2


def test_non_keras_verbs_do_not_import_tensorflow(env, tmp_path):
    uuid = env.save(1, 10)
    env.registry().report_metrics(1, "validation", 10, {"loss": 0.5})
    script = textwrap.dedent(
        f"""
        import sys
        from ckptstore.cli.main import main
        verbs = [
            ["--help"], ["checkpoint", "list"], ["checkpoint", "describe", "{uuid}"],
            ["checkpoint", "verify", "{uuid}"], ["trial", "list"], ["trial", "describe", "1"],
            ["trial", "report", "1", "-o", r"{tmp_path / "r.html"}"], ["model", "list"],
            ["gc", "--dry-run"], ["storage", "validate"], ["reindex"],
        ]
        for argv in verbs:
            try:
                main(argv)
            except SystemExit as exc:
                assert exc.code in (0, None), (argv, exc.code)
        heavy = sorted(m for m in ("tensorflow", "keras", "h5py") if m in sys.modules)
        print("HEAVY", heavy)
        """
    )
    sub_env = _subprocess_env(tmp_path)
    sub_env["CKPTSTORE_STORAGE"], sub_env["CKPTSTORE_REGISTRY"] = env.storage_url, env.registry_url
    result = subprocess.run(
        [sys.executable, "-c", script], env=sub_env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "HEAVY []" in result.stdout, result.stdout[-2000:]
