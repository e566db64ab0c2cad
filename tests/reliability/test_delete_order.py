"""Issue 15 item 2: deletes never leave the registry pointing at nothing.

A delete marks the row DELETING, removes the manifest, then the files, then marks the row
DELETED. Cut at each step (a registry that cannot be written, a storage error, SIGKILL), the
registry never lists a live checkpoint whose manifest is gone, ``latest_checkpoint`` returns the
newest checkpoint that exists, and GC (reconcile) finishes the delete.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import psycopg
import pytest
from click.testing import CliRunner

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.cli.main import cli
from ckptstore.core import init
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from ckptstore.storage_backends.local import LocalStorage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _save(ctx: CheckpointContext, steps: int) -> str:
    with ctx.store_path({"steps_completed": steps}) as (path, uuid):
        with open(os.path.join(path, "weights.bin"), "wb") as f:
            f.write(os.urandom(1000))
    return uuid


def _two_checkpoints(storage_url: str, registry_url: str) -> tuple[str, str]:
    with Registry(registry_url) as reg, CheckpointContext(storage_url, index=reg, trial_id=1) as c:
        reg.ensure_trial(1)
        return _save(c, 1), _save(c, 2)


def assert_consistent(storage_url: str, registry_url: str) -> None:
    """No live registry row points at a checkpoint whose manifest is gone."""
    storage = open_storage(storage_url)
    with Registry(registry_url) as reg:
        for record in reg.checkpoint_records():
            assert fmt.is_committed(storage, record.uuid), record


def _set_read_only(url: str, on: bool) -> None:
    """Real PostgreSQL read-only mode for every new connection to the database."""
    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        value = "on" if on else "off"
        conn.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = {value}')


def test_cli_delete_with_a_read_only_registry_deletes_nothing(tmp_path, postgres_url_factory):
    """The issue's reproduction: `checkpoint delete` with a registry that cannot be written
    deleted the files first, then failed, leaving a COMMITTED row for a deleted checkpoint."""
    storage_url, registry_url = str(tmp_path / "s"), postgres_url_factory()
    older, newest = _two_checkpoints(storage_url, registry_url)
    _set_read_only(registry_url, True)
    result = CliRunner().invoke(
        cli, ["--storage", storage_url, "--registry", registry_url, "checkpoint", "delete",
              newest, "-y"],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "read-only" in str(result.exception) or "read-only" in result.output
    assert scan.list_committed(open_storage(storage_url)) == sorted([older, newest])
    assert_consistent(storage_url, registry_url)
    with Registry(registry_url) as reg, CheckpointContext(storage_url, index=reg) as ctx:
        assert ctx.latest_checkpoint(trial_id=1) == newest
        ctx.download(newest, tmp_path / "dl")  # verified
    _set_read_only(registry_url, False)
    with init(storage=storage_url, registry=registry_url, trial_id=1) as core:
        assert core.info.latest_checkpoint == newest
        with core.checkpoint.restore_path(newest) as path:
            assert os.path.getsize(os.path.join(path, "weights.bin")) == 1000


class FailingDelete(LocalStorage):
    """Local storage whose deletes of a folder's files fail after its manifest was replaced
    by the tombstone (a storage error mid-delete)."""

    def delete(self, key, globs=None):
        if "/" not in key and globs is not None:
            raise errors.StorageUnavailable(f"injected: deleting {key} failed")
        return super().delete(key, globs)


def test_storage_error_mid_delete_is_finished_by_gc(tmp_path, registry_url, caplog):
    storage_url = str(tmp_path / "s")
    older, newest = _two_checkpoints(storage_url, registry_url)
    with Registry(registry_url) as reg:
        broken = CheckpointContext(FailingDelete(storage_url), index=reg, trial_id=1)
        with pytest.raises(errors.StorageUnavailable):
            broken.delete(newest)
        broken.close()
        assert reg.get_checkpoint(newest).state == "DELETING"
        assert_consistent(storage_url, registry_url)
        with CheckpointContext(storage_url, index=reg) as ctx:  # no trial: no start-up repair
            assert ctx.latest_checkpoint(trial_id=1) == older
            with caplog.at_level(logging.INFO, logger="ckptstore"):
                ctx.gc()
            assert "Finished 1 delete(s) cut short" in caplog.text
        assert reg.get_checkpoint(newest).state == "DELETED"
    assert fmt.is_removed(open_storage(storage_url), newest)  # only the tombstone stays
    assert scan.list_committed(open_storage(storage_url)) == [older]


@pytest.mark.parametrize("point", ["marked", "uncommitted", "removed"])
def test_sigkill_mid_delete(tmp_path, registry_url, point):
    storage_url = str(tmp_path / "s")
    older, newest = _two_checkpoints(storage_url, registry_url)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reliability.delete_worker", storage_url, registry_url,
         newest, point],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    assert_consistent(storage_url, registry_url)
    with Registry(registry_url) as reg:
        assert reg.get_checkpoint(newest).state == "DELETING"
        with CheckpointContext(storage_url, index=reg, trial_id=1) as ctx:
            assert ctx.latest_checkpoint() == older  # never the half-deleted one
            ctx.gc()  # rolls the delete forward
        assert reg.get_checkpoint(newest).state == "DELETED"
        assert reg.get_checkpoint(older).state == "COMMITTED"
    assert fmt.is_removed(open_storage(storage_url), newest)  # only the tombstone stays
    assert scan.list_committed(open_storage(storage_url)) == [older]


def test_latest_skips_a_checkpoint_deleted_behind_the_registrys_back(tmp_path, caplog):
    """A folder removed outside ckptstore: latest_checkpoint (context, core info, loader)
    takes the newest that exists and says why."""
    from ckptstore.keras_io.loading._loaders import resolve_checkpoint

    storage_url, registry_url = str(tmp_path / "s"), f"sqlite:///{tmp_path}/r.db"
    older, newest = _two_checkpoints(storage_url, registry_url)
    shutil.rmtree(os.path.join(storage_url, newest))
    with caplog.at_level(logging.WARNING, logger="ckptstore"):
        with init(storage=storage_url, registry=registry_url, trial_id=1) as core:
            assert core.info.latest_checkpoint == older
            assert core.checkpoint.latest_checkpoint() == older
        with Registry(registry_url) as reg:
            found = resolve_checkpoint(reg, lambda _u=None: open_storage(storage_url), 1, None)
            assert found[0] == older
    assert f"Skipping checkpoint {newest} of trial 1" in caplog.text
