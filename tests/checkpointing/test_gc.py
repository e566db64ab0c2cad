"""Retention policies (table tests) and garbage collection on local files and S3."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import (
    AnyOf,
    BestN,
    CheckpointContext,
    CheckpointRecord,
    ExperimentBestN,
    GCPolicy,
    KeepAll,
    LatestN,
    commit,
    scan,
)
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.retention import GCContext
from ckptstore.core._context import build_gc_policy
from tests._helpers.trees import make_tree
from tests.checkpointing._helpers import MemoryIndex, backdate


def records(losses, trial_id=1, prefix="t1"):
    """Checkpoints at steps 1..n with the given val_loss (None: no metric)."""
    return [
        CheckpointRecord(
            uuid=f"{prefix}-{i}",
            trial_id=trial_id,
            steps_completed=i + 1,
            metrics={} if loss is None else {"val_loss": loss},
        )
        for i, loss in enumerate(losses)
    ]


LOSSES = [0.5, 0.2, 0.9, None, 0.4]  # best: step 2 (0.2); worst: step 3 (0.9); latest: step 5


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (LatestN(1), [0, 0, 0, 0, 1]),
        (LatestN(2), [0, 0, 0, 1, 1]),
        (LatestN(0), [0, 0, 0, 0, 0]),
        (LatestN(9), [1, 1, 1, 1, 1]),
        (BestN(1, "val_loss"), [0, 1, 0, 0, 0]),
        (BestN(2, "val_loss"), [0, 1, 0, 0, 1]),
        (BestN(1, "val_loss", smaller_is_better=False), [0, 0, 1, 0, 0]),
        (BestN(1, "val_loss", keep_without_metric=True), [0, 1, 0, 1, 0]),
        (BestN(1, "accuracy"), [0, 0, 0, 0, 0]),
        (AnyOf([LatestN(1), BestN(1, "val_loss")]), [0, 1, 0, 0, 1]),
        (AnyOf([]), [0, 0, 0, 0, 0]),
        (KeepAll(), [1, 1, 1, 1, 1]),
        (GCPolicy.from_determined(metric="val_loss"), [0, 1, 0, 0, 1]),
        # Issue 15: with no metric known, save_trial_best keeps every candidate (was [0,0,0,0,1]).
        (GCPolicy.from_determined(), [1, 1, 1, 1, 1]),
        (GCPolicy.from_determined(save_trial_latest=0, save_trial_best=0), [0, 0, 0, 0, 0]),
        (
            GCPolicy.from_determined(
                save_trial_latest=2, save_trial_best=2, metric="val_loss", smaller_is_better=False
            ),
            [1, 0, 1, 1, 1],
        ),
    ],
)
def test_policy_table(policy, expected):
    flags = policy.should_preserve(records(LOSSES), context=GCContext())
    assert [int(f) for f in flags] == expected


def test_best_reads_nested_validation_metrics_and_ignores_non_numbers():
    recs = records([None, None, None])
    recs[0].metrics = {"validation_metrics": {"val_loss": 0.1}}
    recs[1].metrics = {"val_loss": "n/a"}
    recs[2].metrics = {"val_loss": float("nan")}
    assert BestN(1, "val_loss").should_preserve(recs) == [True, False, False]


def test_experiment_best_keeps_a_trials_checkpoint_only_if_best_in_the_experiment():
    mine = records([0.5, 0.3], trial_id=1, prefix="t1")
    other = records([0.1, 0.4], trial_id=2, prefix="t2")
    context = GCContext(experiment_checkpoints=mine + other)
    assert ExperimentBestN(1, "val_loss").should_preserve(mine, context=context) == [False, False]
    assert ExperimentBestN(2, "val_loss").should_preserve(mine, context=context) == [False, True]
    policy = GCPolicy.from_determined(
        save_trial_latest=0, save_trial_best=0, save_experiment_best=3, metric="val_loss"
    )
    assert policy.should_preserve(mine, context=context) == [False, True]


def test_bad_policy_arguments():
    with pytest.raises(errors.InvalidConfig, match="Received: n=-1"):
        LatestN(-1)
    with pytest.raises(errors.InvalidConfig, match="save_trial_best"):
        GCPolicy.from_determined(save_trial_best="1")
    with pytest.raises(errors.InvalidConfig, match="metric"):
        BestN(1, "")


# ---- collection on real storage ----------------------------------------------------------------
def save_series(ctx, tmp_path, losses, *, trial_id=None):
    src = make_tree(str(tmp_path / "src"), {"model.bin": os.urandom(100), "opt/s.bin": b"s"})
    uuids = []
    for step, loss in enumerate(losses, start=1):
        metrics = {} if loss is None else {"val_loss": loss}
        meta = {"steps_completed": step, "metrics": metrics}
        if trial_id is not None:
            meta["trial_id"] = trial_id
        uuids.append(ctx.upload(src, meta))
    return uuids


def test_gc_from_storage_metadata(local_and_s3_url, tmp_path):
    policy = GCPolicy.from_determined(save_trial_latest=1, save_trial_best=1, metric="val_loss")
    with CheckpointContext(local_and_s3_url, trial_id=1) as other_trial:
        others = save_series(other_trial, tmp_path, [0.7, 0.8])
    with CheckpointContext(local_and_s3_url, trial_id=2, gc_policy=policy) as ctx:
        ctx.gc_policy = None  # save everything first, then collect on demand
        uuids = save_series(ctx, tmp_path, LOSSES)
        ctx.gc_policy = policy
        ctx.protect(uuids[0])  # e.g. the checkpoint this run resumed from
        expected = [uuids[2], uuids[3]]
        assert sorted(ctx.gc(dry_run=True)) == sorted(expected)
        assert len(scan.list_committed(ctx.storage)) == 7  # dry run deleted nothing
        assert sorted(ctx.gc()) == sorted(expected)
        kept = {uuids[0], uuids[1], uuids[4]}
        assert set(scan.list_committed(ctx.storage)) == kept | set(others)
        assert ctx.gc() == []  # idempotent
        for uuid in expected:
            assert fmt.is_removed(ctx.storage, uuid)  # only the tombstone stays


def test_gc_after_each_commit_with_index_and_protection(local_and_s3_url, tmp_path):
    index = MemoryIndex()
    with CheckpointContext(local_and_s3_url, index=index, trial_id=1, experiment_id=1) as t1:
        save_series(t1, tmp_path, [0.05])
        best_of_experiment = t1.latest_checkpoint()
    policy = {
        "save_trial_latest": 1,
        "save_trial_best": 0,
        "save_experiment_best": 2,
        "metric": "val_loss",
    }
    with CheckpointContext(
        local_and_s3_url, index=index, trial_id=2, experiment_id=1, gc_policy=policy
    ) as ctx:
        first = save_series(ctx, tmp_path, [0.5])[0]
        index.protected.add(first)  # registered as a model version
        uuids = save_series(ctx, tmp_path, [0.9, 0.1, 0.8, 0.7])
        ctx.wait()
        # latest (0.7), experiment top-2 = {t1's 0.05, this trial's 0.1}, protected first
        kept = {first, uuids[1], uuids[3]}
        mine = {r.uuid for r in index.checkpoint_records(trial_id=2)}
        assert mine == kept
        assert set(scan.list_committed(ctx.storage)) == kept | {best_of_experiment}
        assert index.records[uuids[0]].state == "DELETED"
        assert index.records[uuids[2]].state == "DELETED"


def test_gc_tolerates_files_already_gone(storage_url_factory, tmp_path):
    index = MemoryIndex()
    with CheckpointContext(storage_url_factory("file"), index=index, trial_id=1) as ctx:
        uuids = save_series(ctx, tmp_path, [0.3, 0.2, 0.1])
        ctx.storage.delete(uuids[0])  # someone removed it by hand
        ctx.storage.delete(f"{uuids[1]}/model.bin")
        ctx.gc_policy = LatestN(1)
        assert sorted(ctx.gc()) == sorted(uuids[:2])
        assert scan.list_committed(ctx.storage) == [uuids[2]]


def write_leftover(storage, name):
    storage.write_bytes(f"{name}/weights.bin", b"partial")
    commit.write_pending_marker(storage, name)


def test_gc_removes_only_stale_uncommitted_leftovers(local_and_s3_url, tmp_path, monkeypatch):
    with CheckpointContext(local_and_s3_url, gc_grace_seconds=600) as ctx:
        [good] = save_series(ctx, tmp_path, [0.1])
        stale, fresh, foreign = (
            "aaaaaaaa-0000-4000-8000-000000000001",
            "aaaaaaaa-0000-4000-8000-000000000002",
            "aaaaaaaa-0000-4000-8000-000000000003",
        )
        write_leftover(ctx.storage, stale)
        backdate(monkeypatch, ctx.storage, f"{stale}/{fmt.PENDING_MARKER_NAME}", 3600)
        write_leftover(ctx.storage, fresh)
        # A UUID folder without ckptstore's marker (Determined writes no manifest) is not ours,
        # however old.
        ctx.storage.write_bytes(f"{foreign}/metadata.json", b'{"steps_completed": 1}')
        backdate(monkeypatch, ctx.storage, f"{foreign}/metadata.json", 10 * 86400)
        ctx.storage.write_bytes("not-a-checkpoint/readme.txt", b"left alone")  # no marker
        assert ctx.gc() == [stale]
        assert ctx.storage.exists(f"{foreign}/metadata.json")
        # Its commit slot stays fenced: a writer waking up now cannot commit into it.
        assert fmt.is_removed(ctx.storage, stale)
        assert ctx.storage.exists(f"{fresh}/weights.bin")
        assert ctx.storage.exists("not-a-checkpoint/readme.txt")
        assert scan.list_committed(ctx.storage) == [good]
        ctx.protect(fresh)
        ctx.gc_grace_seconds = 0
        assert ctx.gc() == []  # protected even when stale


def test_gc_removes_stale_local_staging_folders(storage_url_factory):
    root = storage_url_factory("file")
    with CheckpointContext(root, gc_grace_seconds=60) as ctx:
        staging = os.path.join(root, fmt.STAGING_PREFIX + "bbbbbbbb-0000-4000-8000-000000000001")
        make_tree(staging, {"w.bin": b"half"})
        assert ctx.gc() == []  # too young
        old = time.time() - 3600
        for path in (os.path.join(staging, "w.bin"), staging):
            os.utime(path, (old, old))
        assert ctx.gc() == [os.path.basename(staging)]
        assert not os.path.exists(staging)


def test_gc_spares_a_local_checkpoint_while_restore_path_uses_it(storage_url_factory, tmp_path):
    with CheckpointContext(storage_url_factory("file"), trial_id=1) as ctx:
        old, new = save_series(ctx, tmp_path, [0.2, 0.1])
        ctx.gc_policy = LatestN(1)
        with ctx.restore_path(old) as path:
            assert ctx.gc() == []
            assert os.path.isfile(os.path.join(path, "model.bin"))
        assert ctx.gc() == [old]
        assert scan.list_committed(ctx.storage) == [new]


def test_a_whole_file_upload_whose_folder_gc_removed_commits_nothing(storage_url_factory, tmp_path):
    """GC in another process (or a grace period shorter than the upload) removes an upload's
    folder, files and pending marker; the upload must not then write a manifest naming files
    that are gone (a committed checkpoint that cannot be read)."""
    with CheckpointContext(storage_url_factory("s3"), dedup=False, gc_policy=None) as ctx:
        real_write = ctx.storage.write_bytes

        def gc_strikes_before_metadata(key: str, data: bytes) -> None:
            if key.endswith("/" + fmt.METADATA_NAME):
                ctx.storage.delete(key.split("/", 1)[0])  # what _collect_leftovers does
            real_write(key, data)

        ctx.storage.write_bytes = gc_strikes_before_metadata
        with pytest.raises(errors.CheckpointError, match="grace period"):
            ctx.upload(make_tree(str(tmp_path / "a"), {"w.bin": b"w" * 5000}))
        assert scan.list_committed(ctx.storage) == []


@pytest.mark.parametrize("dedup", [False, True])
def test_gc_in_the_same_context_never_takes_a_running_foreground_upload(
    storage_url_factory, tmp_path, dedup
):
    """``gc_grace_seconds=0`` and a GC thread: uploads in the caller's thread are in flight for
    this context's GC, as background ones are, so every upload commits, readable."""
    import threading

    stop = threading.Event()
    errors_seen: list[BaseException] = []
    with CheckpointContext(
        storage_url_factory("s3"), gc_policy=None, gc_grace_seconds=0, dedup=dedup
    ) as ctx:

        def gc_loop() -> None:
            while not stop.is_set():
                try:
                    ctx.gc()
                except BaseException as exc:  # noqa: BLE001 - asserted below
                    errors_seen.append(exc)
                    return

        thread = threading.Thread(target=gc_loop)
        thread.start()
        try:
            made = [
                ctx.upload(make_tree(str(tmp_path / f"s{i}"), {"w.bin": b"w" * 20_000}))
                for i in range(12)
            ]
        finally:
            stop.set()
            thread.join(30)
        assert not errors_seen
        assert sorted(scan.list_committed(ctx.storage)) == sorted(made)
        for uuid in made:  # every one complete: downloads verify sizes and checksums
            ctx.download(uuid, str(tmp_path / "dl" / uuid))
            assert (tmp_path / "dl" / uuid / "w.bin").read_bytes() == b"w" * 20_000


def test_gc_asks_again_which_uploads_are_in_flight_before_removing_a_leftover(tmp_path):
    """An upload that registers after GC started (and writes its folder before GC lists) is
    in flight when GC reaches its folder: a callable ``in_flight`` is asked then; a snapshot
    taken at the start would have it removed."""
    from ckptstore.checkpointing import commit
    from ckptstore.checkpointing.collector import collect
    from ckptstore.storage_backends import open_storage

    uuid = "3f2b8c1e-0000-4000-8000-000000000001"
    with open_storage("memory://gc-asks-again/root") as storage:
        commit.write_pending_marker(storage, uuid)
        storage.write_bytes(f"{uuid}/w.bin", b"w")
        registered: set[str] = set()
        asked: list[int] = []

        def in_flight() -> set[str]:
            asked.append(1)
            if len(asked) > 1:  # registered after GC's first look
                registered.add(uuid)
            return set(registered)

        assert collect(storage, policy=None, in_flight=in_flight, grace_seconds=0) == []
        assert len(asked) >= 2 and storage.exists(f"{uuid}/w.bin")
        # A snapshot (the old behaviour) misses it: the folder goes.
        assert collect(storage, policy=None, in_flight=[], grace_seconds=0) == [uuid]
        assert not storage.exists(f"{uuid}/w.bin")


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32)),
        max_size=8,
    ),
    latest=st.integers(0, 3),
    best=st.integers(0, 3),
    exp_best=st.integers(0, 3),
    smaller=st.booleans(),
)
def test_the_kept_by_reasons_are_gcs_own_decision(values, latest, best, exp_best, smaller):
    """What the UI says keeps a checkpoint is what GC keeps: a checkpoint has a reason exactly
    when the policy preserves it (one policy object, no second copy of the rules)."""
    records = [
        CheckpointRecord(uuid=f"u{i}", steps_completed=i, metrics={"val_loss": v})
        for i, v in enumerate(values)
    ]
    other = [CheckpointRecord(uuid="x", steps_completed=1, metrics={"val_loss": 0.0})]
    context = GCContext(experiment_checkpoints=other, searcher_metric="val_loss")
    policy = GCPolicy.from_config(
        {
            "save_trial_latest": latest,
            "save_trial_best": best,
            "save_experiment_best": exp_best,
            "smaller_is_better": smaller,
        }
    )
    keep = policy.should_preserve(records, context=context)
    reasons = policy.reasons(records, context=context)
    assert [bool(r) for r in reasons] == keep
    for r, labels in zip(records, reasons, strict=True):
        assert all("save_" in label for label in labels), labels
        if any(label.startswith("latest") for label in labels):
            assert r.steps_completed >= len(records) - latest


def test_the_defaults_name_exactly_the_keys_split_off_storage_dicts():
    from ckptstore.checkpointing.retention import DETERMINED_DEFAULTS
    from ckptstore.storage_backends.config import GC_KEYS

    assert set(DETERMINED_DEFAULTS) == set(GC_KEYS)


def test_gc_keys_are_checked_in_one_place():
    for bad, match in (
        ([1], "a dict of Determined"),
        ({"save_trial_lates": 1}, "unknown key"),
        ({"save_trial_best": -1}, "save_trial_best"),
        ({"save_trial_best": True}, "save_trial_best"),
    ):
        for build in (GCPolicy.from_config, build_gc_policy):
            with pytest.raises(errors.InvalidConfig, match=match):
                build(bad)
