"""Issue 39: every UI page renders for signed, deduplicated, sharded and Determined-imported
checkpoints (a test per kind), each on local files and on S3 (the moto server). A signed
checkpoint's trial page answered HTTP 400 (the file name model.sig was masked as a secret and
its size became '***')."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing import format as fmt
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings
from tests.cli.helpers import make_env


def _pages_render(env, uuid: str) -> str:
    """Every page that shows the checkpoint answers 200; returns its checkpoint page."""
    settings = UiSettings(
        registry_url=env.registry_url,
        storage_url=env.storage_url,
        allowed_hosts=("testserver",),
    )
    with Registry(env.registry_url) as registry:
        trial_id = registry.get_checkpoint(uuid).trial_id
    with TestClient(create_app(settings)) as client:
        for url in ("/", "/checkpoints", f"/trials/{trial_id}", f"/checkpoints/{uuid}"):
            answer = client.get(url)
            assert answer.status_code == 200, (url, answer.text[-2000:])
        verified = client.post(
            f"/checkpoints/{uuid}/verify", headers={"Origin": "http://testserver"}
        )
        assert verified.status_code < 500, verified.text[-2000:]
        archive = client.get(f"/checkpoints/{uuid}/archive.tar")
        assert archive.status_code == 200, archive.text[-2000:]
        return client.get(f"/checkpoints/{uuid}").text


def _upload(env, folder: Path, **options) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.keras").write_bytes(b"k" * 3000)
    (folder / "notes.txt").write_text("hello")
    with Registry(env.registry_url) as registry:
        with CheckpointContext(env.storage_url, index=registry, trial_id=1, **options) as ctx:
            return ctx.upload(str(folder), {"steps_completed": 1})


@pytest.fixture(params=("file", "s3"))
def kinds_env(request, tmp_path, storage_url_factory):
    """A registry with trial 1 beside a fresh store on local files or on S3."""
    environment = make_env(tmp_path, storage_url_factory(request.param))
    with Registry(environment.registry_url) as registry:
        registry.ensure_trial(1)
    return environment


def test_a_signed_checkpoint(kinds_env, tmp_path):
    from tests.checkpointing._helpers import ec_key_pair

    key, _ = ec_key_pair(tmp_path)
    uuid = _upload(kinds_env, tmp_path / "src", signing_key=key)
    assert "model.sig" in fmt.read_manifest(open_storage(kinds_env.storage_url), uuid)["files"]
    page = _pages_render(kinds_env, uuid)
    assert "model.sig" in page


def test_a_deduplicated_checkpoint(kinds_env, tmp_path):
    uuid = _upload(kinds_env, tmp_path / "src", dedup=True)
    assert fmt.read_manifest(open_storage(kinds_env.storage_url), uuid)["format_version"] == 2
    assert "model.keras" in _pages_render(kinds_env, uuid)


def test_a_sharded_checkpoint(kinds_env, tmp_path):
    from tests.checkpointing.test_sharded import run_ranks

    results = run_ranks(2, "store_path", kinds_env.storage_url, tmp_path / "ranks")
    assert all(r["error"] is None for r in results), results
    with Registry(kinds_env.registry_url) as registry:
        registry.reindex(open_storage(kinds_env.storage_url))
        (row,) = registry.list_checkpoints()
        if row.trial_id is None:  # the workers ran without a trial: give it one
            record = row.to_record()
            record.trial_id = 1
            registry.record_checkpoint(record)
    assert "rank1/w.bin" in _pages_render(kinds_env, results[0]["uuid"])


def test_a_determined_imported_checkpoint(kinds_env, tmp_path):
    from tests.import_determined.determined_fixtures import make_values, write_callback_checkpoint

    folder = tmp_path / "det-ckpt"
    write_callback_checkpoint(str(folder), make_values())
    imported = kinds_env.run("import-determined", str(folder), "--trial", "1")
    assert imported.exit_code == 0, imported.output
    (uuid,) = [c["uuid"] for c in kinds_env.json("checkpoint", "list")]
    _pages_render(kinds_env, uuid)
