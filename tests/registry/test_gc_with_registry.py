"""GC with the real registry as index: the policy table on SQLite and PostgreSQL, over local
files and S3 (moto server). Kept checkpoints stay COMMITTED in the registry and in storage;
collected ones are DELETED in both. Registered model versions and the resumed-from checkpoint
are never collected; a partial delete by globs leaves PARTIALLY_DELETED with fewer resources.
"""

from __future__ import annotations

import pytest

from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing import format as fmt
from ckptstore.registry import Registry

#: val_loss of trial 1's four checkpoints, at steps 1..4.
LOSSES = (0.5, 0.1, 0.4, 0.3)

# (case id, policy, extra set-up, indexes of trial-1 checkpoints kept (0-based))
CASES = [
    (
        "latest1_best1",
        {"save_trial_latest": 1, "save_trial_best": 1, "metric": "val_loss"},
        None,
        {1, 3},
    ),
    ("latest2_only", {"save_trial_latest": 2, "save_trial_best": 0}, None, {2, 3}),
    (
        "best_larger_is_better",
        {
            "save_trial_latest": 1,
            "save_trial_best": 1,
            "metric": "val_loss",
            "smaller_is_better": False,
        },
        None,
        {0, 3},
    ),
    (
        "experiment_best",
        {
            "save_trial_latest": 0,
            "save_trial_best": 0,
            "save_experiment_best": 1,
            "metric": "val_loss",
        },
        None,
        {1},
    ),
    ("model_version_kept", {"save_trial_latest": 1, "save_trial_best": 0}, "register", {0, 3}),
    ("resumed_from_kept", {"save_trial_latest": 1, "save_trial_best": 0}, "protect", {2, 3}),
    ("keep_none_but_latest", {"save_trial_latest": 1, "save_trial_best": 0}, None, {3}),
]


@pytest.fixture
def src(tmp_path) -> str:
    root = tmp_path / "src"
    (root / "opt").mkdir(parents=True)
    (root / "model.keras").write_bytes(b"m" * 200)
    (root / "opt" / "state.bin").write_bytes(b"s" * 40)
    return str(root)


def _exists(ctx: CheckpointContext, uuid: str) -> bool:
    """Its files are in storage (a deleted checkpoint leaves only its tombstone)."""
    return bool(ctx.storage.list(uuid)) and not fmt.is_removed(ctx.storage, uuid)


@pytest.mark.parametrize(("case", "policy", "setup", "kept"), CASES, ids=[c[0] for c in CASES])
def test_gc_policy_table(case, policy, setup, kept, local_and_s3_url, registry_url, src):
    with Registry(registry_url) as registry:
        exp = registry.create_experiment(f"gc-{case}")
        with CheckpointContext(
            local_and_s3_url, index=registry, trial_id=1, experiment_id=exp
        ) as ctx:
            uuids = [
                ctx.upload(src, {"steps_completed": step + 1, "metrics": {"val_loss": loss}})
                for step, loss in enumerate(LOSSES)
            ]
        # another trial of the same experiment: GC of trial 1 must never touch it
        with CheckpointContext(
            local_and_s3_url, index=registry, trial_id=2, experiment_id=exp
        ) as ctx:
            other = ctx.upload(src, {"steps_completed": 1, "metrics": {"val_loss": 0.2}})

        with CheckpointContext(
            local_and_s3_url, index=registry, trial_id=1, experiment_id=exp, gc_policy=policy
        ) as ctx:
            if setup == "register":
                registry.create_model("m").register_version(uuids[0])
            elif setup == "protect":
                ctx.protect(uuids[2])  # the checkpoint this run resumed from
            deleted = ctx.gc()
            assert sorted(deleted) == sorted(u for i, u in enumerate(uuids) if i not in kept)
            for i, uuid in enumerate(uuids):
                state = registry.get_checkpoint(uuid).state
                if i in kept:
                    assert state == "COMMITTED" and _exists(ctx, uuid), (case, i)
                else:
                    assert state == "DELETED" and not _exists(ctx, uuid), (case, i)
            assert registry.get_checkpoint(other).state == "COMMITTED" and _exists(ctx, other)
            assert ctx.gc() == []  # idempotent
        assert registry.latest_checkpoint(1).uuid == uuids[max(kept)]


def test_partial_delete_by_globs_updates_registry(local_and_s3_url, registry_url, src):
    with Registry(registry_url) as registry:
        with CheckpointContext(local_and_s3_url, index=registry, trial_id=5) as ctx:
            uuid = ctx.upload(src, {"steps_completed": 3})
            before = registry.get_checkpoint(uuid).resources
            assert set(before) >= {"model.keras", "opt/state.bin", "metadata.json"}
            ctx.delete(uuid, globs=["opt/*"])
            ckpt = registry.get_checkpoint(uuid)
            assert ckpt.state == "PARTIALLY_DELETED"
            assert ckpt.resources == {k: v for k, v in before.items() if k != "opt/state.bin"}
            assert "opt/state.bin" not in fmt.read_manifest(ctx.storage, uuid)["files"]
            # still live: latest, and registrable as a model version (then protected from GC)
            assert registry.latest_checkpoint(5).uuid == uuid
            registry.create_model("partial").register_version(uuid)
            assert uuid in registry.protected_checkpoint_uuids()
            with CheckpointContext(
                local_and_s3_url, index=registry, trial_id=5, gc_policy={"save_trial_latest": 0}
            ) as gc_ctx:
                assert gc_ctx.gc() == []
            assert registry.get_checkpoint(uuid).state == "PARTIALLY_DELETED"
