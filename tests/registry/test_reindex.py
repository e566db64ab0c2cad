"""Storage is the source of truth: a registry rebuilt by ``reindex`` from storage holds the same
checkpoint rows as the registry that watched the saves (local files and S3; SQLite and
PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest

from ckptstore.checkpointing import CheckpointContext, blobs
from ckptstore.checkpointing import format as fmt
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree

FIELDS = (
    "uuid",
    "trial_id",
    "experiment_id",
    "steps_completed",
    "continue_id",
    "state",
    "metadata",
    "metrics",
    "resources",
    "storage_url",
    "created_at",
)


def _rows(registry: Registry, states=("COMMITTED", "PARTIALLY_DELETED")) -> dict[str, dict]:
    out = {}
    for ckpt in registry.list_checkpoints(states=states):
        record = dataclasses.asdict(ckpt.to_record())
        out[ckpt.uuid] = {k: record[k] for k in FIELDS}
    return out


def _save_some(url: str, registry: Registry, tmp_path, *, dedup: bool = False) -> list[str]:
    src = make_tree(tmp_path / "src", {"model.keras": b"m" * 300, "opt/state.bin": b"s" * 50})
    uuids = []
    for trial_id, experiment_id in ((1, 10), (2, 10), (3, None)):
        with CheckpointContext(
            url, index=registry, trial_id=trial_id, experiment_id=experiment_id, dedup=dedup
        ) as ctx:
            for step in (5, 10):
                uuids.append(
                    ctx.upload(
                        src,
                        {
                            "steps_completed": step * trial_id,
                            "metrics": {"validation_metrics": {"val_loss": 1.0 / step}},
                            "epoch": step,
                        },
                    )
                )
    with CheckpointContext(url, index=registry, trial_id=1, experiment_id=10) as ctx:
        ctx.delete(uuids[0], globs=["opt/*"])  # PARTIALLY_DELETED, resources shrink
        ctx.delete(uuids[2])  # DELETED
    return uuids


@pytest.mark.parametrize("dedup", [False, True], ids=["whole-file", "dedup"])
def test_reindex_reproduces_checkpoint_rows(
    local_and_s3_url, registry_url, tmp_path, request, dedup
):
    """Format 1 and format 2 (deduplicated: the folders hold only metadata and manifest,
    the content is in shared blobs) give the same rows."""
    with Registry(registry_url) as saved:
        uuids = _save_some(local_and_s3_url, saved, tmp_path, dedup=dedup)
        with open_storage(local_and_s3_url) as storage:
            manifest = fmt.read_manifest(storage, uuids[1])
            assert manifest["format_version"] == (
                fmt.BLOBS_FORMAT_VERSION if dedup else fmt.FORMAT_VERSION
            )
            assert storage.exists(blobs.BLOBS_DIR) is dedup
        expected = _rows(saved)
        assert saved.get_checkpoint(uuids[0]).state == "PARTIALLY_DELETED"
        assert saved.get_checkpoint(uuids[2]).state == "DELETED"
        assert len(expected) == 5
        assert "opt/state.bin" not in expected[uuids[0]]["resources"]

    fresh_url = (
        f"sqlite:///{tmp_path / 'fresh.db'}"
        if registry_url.startswith("sqlite")
        else request.getfixturevalue("postgres_url_factory")()
    )
    with Registry(fresh_url) as fresh, open_storage(local_and_s3_url) as storage:
        assert fresh.reindex(storage) == 5
        assert _rows(fresh) == expected
        assert {t.id for t in fresh.list_trials()} == {1, 2, 3}
        assert fresh.get_trial(2).experiment_id == 10
        assert [e.id for e in fresh.list_experiments()] == [10]
        assert fresh.latest_checkpoint(2).uuid == uuids[3]
        # reindexing twice changes nothing
        assert fresh.reindex(storage) == 5
        assert _rows(fresh) == expected
        assert len(fresh.list_checkpoints()) == 5


def test_reindex_marks_checkpoints_gone_from_storage_deleted(
    registry_url, storage_url_factory, tmp_path
):
    url = storage_url_factory("file")
    with Registry(registry_url) as registry, open_storage(url) as storage:
        src = make_tree(tmp_path / "src", {"w.bin": b"w" * 10})
        with CheckpointContext(storage, index=registry, trial_id=4) as ctx:
            keep = ctx.upload(src, {"steps_completed": 1})
            lost = ctx.upload(src, {"steps_completed": 2})
        # a row for another storage and a PENDING row must not be touched
        from ckptstore.checkpointing.index import CheckpointRecord

        registry.record_checkpoint(
            CheckpointRecord(
                uuid="elsewhere", trial_id=4, state="COMMITTED", storage_url="s3://x/y"
            )
        )
        registry.record_checkpoint(
            CheckpointRecord(uuid="uploading", trial_id=4, state="PENDING", storage_url=storage.url)
        )
        storage.delete(lost)  # removed behind the registry's back
        assert registry.latest_checkpoint(4).uuid == lost
        assert registry.reindex(storage) == 1
        assert registry.get_checkpoint(lost).state == "DELETED"
        assert registry.get_checkpoint(keep).state == "COMMITTED"
        assert registry.get_checkpoint("elsewhere").state == "COMMITTED"
        assert registry.get_checkpoint("uploading").state == "PENDING"
        assert registry.latest_checkpoint(4).uuid == keep
