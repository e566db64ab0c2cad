"""Deduplicated checkpoints (``dedup=True``, format 2): content stored once per prefix as
SHA-256-addressed chunks; readers get ordinary, verified files; deletes are reference-counted."""

from __future__ import annotations

import json
import os
import pathlib
import random
import threading
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptstore.core
from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, LatestN, blob_gc, blobs, condemned, scan
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt
from ckptstore.cli.main import cli
from tests._helpers.trees import make_tree, read_tree

CHUNK = 2**16


def stored(ctx: CheckpointContext) -> set[str]:
    names = {k.rsplit("/", 1)[-1] for k in ctx.storage.list(blobs.BLOBS_DIR)}
    return {n for n in names if blobs.SHA_RE.match(n)}


def tree(seed: int, *, frozen: bytes) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        "model/frozen.bin": frozen,
        "model/head.bin": rng.randbytes(3 * CHUNK + 17),
        "config.json": json.dumps({"seed": seed}).encode(),
    }


@pytest.fixture
def frozen() -> bytes:
    return random.Random(0).randbytes(20 * CHUNK)


def test_unchanged_chunks_are_not_uploaded_and_files_come_back_identical(
    local_and_s3_url, frozen, tmp_path
):
    with CheckpointContext(
        local_and_s3_url, trial_id=1, dedup=True, dedup_chunk_bytes=CHUNK
    ) as ctx:
        first = tree(1, frozen=frozen)
        u1 = ctx.upload(make_tree(str(tmp_path / "a"), first), {"steps_completed": 1})
        after_first = stored(ctx)
        second = tree(2, frozen=frozen)
        with ctx.store_path({"steps_completed": 2}) as (path, u2):
            make_tree(str(path), second)
        new = stored(ctx) - after_first
        # Only the head's 4 chunks and the small config changed; the 20 frozen chunks are shared.
        assert len(new) == 5
        assert sum(len(ctx.storage.read_bytes(blobs.blob_key(s))) for s in new) == len(
            second["model/head.bin"]
        ) + len(second["config.json"])
        # The checkpoint folders hold only metadata and the manifest: the content is in blobs.
        assert set(ctx.storage.list(u2)) == {fmt.METADATA_NAME, fmt.MANIFEST_NAME}
        assert fmt.read_manifest(ctx.storage, u2)["format_version"] == fmt.BLOBS_FORMAT_VERSION
        ctx.download(u1, tmp_path / "d1")
        assert read_tree(str(tmp_path / "d1")) == {
            **first,
            fmt.METADATA_NAME: ctx.storage.read_bytes(f"{u1}/{fmt.METADATA_NAME}"),
        }
        with ctx.restore_path(u2, selector="model/*") as path:
            got = read_tree(str(path))
        assert got == {k: v for k, v in second.items() if k.startswith("model/")}


def test_whole_file_and_dedup_checkpoints_share_a_prefix(tmp_path, frozen):
    url = str(tmp_path / "store")
    with CheckpointContext(url, trial_id=1, dedup=False) as ctx:
        old = ctx.upload(make_tree(str(tmp_path / "a"), tree(1, frozen=frozen)))
        assert fmt.read_manifest(ctx.storage, old)["format_version"] == fmt.FORMAT_VERSION
        assert not ctx.storage.exists(blobs.BLOBS_DIR)
    with CheckpointContext(url, trial_id=1, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        new = ctx.upload(make_tree(str(tmp_path / "b"), tree(2, frozen=frozen)))
        assert scan.list_committed(ctx.storage) == sorted([old, new])
        with ctx.restore_path(old) as path:
            assert read_tree(str(path))["model/frozen.bin"] == frozen
        with ctx.restore_path(new) as path:
            assert read_tree(str(path))["model/frozen.bin"] == frozen


def test_gc_and_partial_delete_remove_only_unreferenced_blobs(tmp_path, frozen):
    url = str(tmp_path / "store")
    with CheckpointContext(
        url, trial_id=1, dedup=True, dedup_chunk_bytes=CHUNK, gc_policy=LatestN(1)
    ) as ctx:
        u1 = ctx.upload(make_tree(str(tmp_path / "a"), tree(1, frozen=frozen)))
        ctx.wait()
        first = fmt.load_manifest(ctx.storage, u1).blobs()
        u2 = ctx.upload(make_tree(str(tmp_path / "b"), tree(2, frozen=frozen)))
        ctx.wait()  # GC (LatestN(1)) deleted u1 and swept its own blobs
        assert scan.list_committed(ctx.storage) == [u2]
        used = fmt.load_manifest(ctx.storage, u2).blobs()
        assert stored(ctx) == used
        assert first - used and not (first - used) & stored(ctx)
        # Partial delete: the manifest is rewritten first; the head's blobs go at the next GC.
        ctx.delete(u2, globs=["model/head.bin"])
        ctx.gc()
        assert stored(ctx) == fmt.load_manifest(ctx.storage, u2).blobs()
        with ctx.restore_path(u2) as path:
            assert sorted(read_tree(str(path))) == [
                "config.json",
                fmt.METADATA_NAME,
                "model/frozen.bin",
            ]


def test_blobs_named_by_an_in_flight_upload_are_kept(tmp_path):
    url = str(tmp_path / "store")
    # No GC policy: the background GC after a commit would sweep too, racing the sweeps this
    # test makes itself (on a loaded machine it ran first and took the blobs).
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=4096, gc_policy=None) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), {"x.bin": b"a" * 9000}))
        shas = fmt.load_manifest(ctx.storage, uuid).blobs()
        # Another process is uploading a checkpoint that reuses them; its manifest is not
        # written yet, only its pending marker.
        in_flight = "0b7c6f5e-0000-4000-8000-000000000001"
        from ckptstore.checkpointing import commit

        commit.write_pending_marker(ctx.storage, in_flight, shas)
        ctx.delete(uuid)
        assert blob_gc.sweep(ctx.storage) == []
        assert stored(ctx) == shas
        ctx.storage.delete(in_flight)  # that upload died and its leftovers were removed
        assert sorted(blob_gc.sweep(ctx.storage)) == sorted(shas)
        assert stored(ctx) == set()


def _pause_sweep_after_reading_references(monkeypatch):
    """Pause every sweep right after it has read the references it will delete by (the moment
    a writer's marker is invisible to it); returns (decided, go_on) events."""
    decided, go_on = threading.Event(), threading.Event()
    real = blob_gc._references

    def read_then_pause(storage):
        refs = real(storage)
        if condemned.read_all(storage).claims:  # the read a delete goes by (after its claim)
            decided.set()
            assert go_on.wait(60)
        return refs

    monkeypatch.setattr(blob_gc, "_references", read_then_pause)
    return decided, go_on


def test_a_writer_never_waits_for_a_running_sweep_and_never_commits_a_blob_it_deletes(
    tmp_path, monkeypatch
):
    """The race of shared content-addressed stores: a sweep has read the references, then an
    upload finds a blob the sweep will delete and would reuse it. The upload commits at once
    (no waiting on the sweep), storing that file whole, and the sweep's deletes leave it
    readable."""
    content = {"x.bin": random.Random(5).randbytes(9000), "y.bin": b"y" * 5000}
    with CheckpointContext(
        str(tmp_path / "store"), dedup=True, dedup_chunk_bytes=4096, gc_policy=None
    ) as ctx:
        first = ctx.upload(make_tree(str(tmp_path / "a"), {"x.bin": content["x.bin"]}))
        shas = fmt.load_manifest(ctx.storage, first).blobs()
        ctx.delete(first)  # its blobs are unreferenced now
        decided, go_on = _pause_sweep_after_reading_references(monkeypatch)
        removed: list[str] = []
        sweeper = threading.Thread(target=lambda: removed.extend(blob_gc.sweep(ctx.storage)))
        sweeper.start()
        try:
            assert decided.wait(60)
            uuid = ctx.upload(make_tree(str(tmp_path / "b"), content))  # the sweep is paused
            entries = fmt.read_manifest(ctx.storage, uuid)["files"]
            assert "blobs" not in entries["x.bin"]  # threatened: stored whole
            assert "blobs" in entries["y.bin"]  # its own new blob: deduplicated
        finally:
            go_on.set()
        sweeper.join(60)
        assert sorted(removed) == sorted(shas)  # the sweep removed what it condemned ...
        out = tmp_path / "out"
        ctx.download(uuid, str(out))  # ... and the commit needs none of it
        assert {k: v for k, v in read_tree(str(out)).items() if k in content} == content
        assert blob_gc.check(ctx.storage)["missing"] == {}


def test_a_sweep_killed_after_its_claim_blocks_no_writer(tmp_path):
    """A sweep that died after claiming (no ``done``) leaves its claim for ever; writers commit
    at once, avoid its blobs while its window may still be open, and dedup them again after."""
    content = {"x.bin": random.Random(6).randbytes(9000)}
    with CheckpointContext(
        str(tmp_path / "store"), dedup=True, dedup_chunk_bytes=4096, gc_policy=None
    ) as ctx:
        first = ctx.upload(make_tree(str(tmp_path / "a"), content))
        shas = fmt.load_manifest(ctx.storage, first).blobs()
        ctx.delete(first)
        cond = condemned.condemn(ctx.storage, shas, delay=0, window=600)
        condemned.mark(ctx.storage, cond.name, "claim", "deadbeef")  # then SIGKILL: no done
        uuid = ctx.upload(make_tree(str(tmp_path / "b"), content))
        assert "blobs" not in fmt.read_manifest(ctx.storage, uuid)["files"]["x.bin"]
        # The window has closed, by the storage's clock: its blobs are safe again.
        backdate_condemnation(ctx.storage, cond.name, 600 + 2 * condemned.STAMP_SLACK_SECONDS)
        again = ctx.upload(make_tree(str(tmp_path / "c"), content))
        assert "blobs" in fmt.read_manifest(ctx.storage, again)["files"]["x.bin"]
        for u in (uuid, again):
            ctx.download(u, str(tmp_path / f"out-{u}"))


def backdate_condemnation(storage, name: str, seconds: float) -> None:
    """Age a condemnation on a local store (mtime) and drop this process's cached copy."""
    path = storage.local_path(f"{condemned.CONDEMNED_DIR}/{name}")
    stamp = os.stat(path).st_mtime - seconds
    os.utime(path, (stamp, stamp))
    condemned._READ.clear()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"delay_seconds": NaN, "window_seconds": 600, "blobs": []}',
        b'{"delay_seconds": 0, "window_seconds": Infinity, "blobs": []}',
        b'{"delay_seconds": "soon", "window_seconds": 600, "blobs": []}',
        b'{"delay_seconds": 315360000, "window_seconds": 600, "blobs": []}',  # ten years
        b'{"delay_seconds": 0, "window_seconds": 1e300, "blobs": []}',
        b'{"delay_seconds": 0, "window_seconds": 600, "blobs": ["../../etc/passwd"]}',
        b"[" * 5000,
    ],
)
def test_hostile_condemnations_neither_stall_a_save_nor_license_a_delete(tmp_path, body):
    content = {"x.bin": random.Random(7).randbytes(9000)}
    with CheckpointContext(
        str(tmp_path / "store"), dedup=True, dedup_chunk_bytes=4096, gc_policy=None
    ) as ctx:
        first = ctx.upload(make_tree(str(tmp_path / "a"), content))
        shas = sorted(fmt.load_manifest(ctx.storage, first).blobs())
        body = body.replace(b'"blobs": []', b'"blobs": ' + json.dumps(shas).encode())
        for name in ("hostile.json", "hostile.json.claim-x"):
            ctx.storage.write_bytes(f"{condemned.CONDEMNED_DIR}/{name}", body)
        second = ctx.upload(make_tree(str(tmp_path / "b"), content))  # ignores it: dedups
        assert "blobs" in fmt.read_manifest(ctx.storage, second)["files"]["x.bin"]
        assert blob_gc.sweep(ctx.storage) == []  # nothing unreferenced; the file removed
        assert "hostile.json" not in ctx.storage.list(condemned.CONDEMNED_DIR)
        for u in (first, second):
            ctx.download(u, str(tmp_path / f"out-{u}"))


def test_an_upload_collected_as_stale_by_gc_commits_nothing(tmp_path, monkeypatch):
    """GC removes an upload's folder (and pending marker) once its marker is older than the
    grace period; a sweep may then take the blobs that upload created. It must not commit."""
    with CheckpointContext(
        str(tmp_path / "store"), dedup=True, dedup_chunk_bytes=4096, gc_policy=None
    ) as ctx:
        real = condemned.threats

        def gc_collects_the_leftover(storage, *args):
            for name in storage.list_children(""):
                if not name.startswith("."):
                    storage.delete(name)
            return real(storage, *args)

        monkeypatch.setattr(condemned, "threats", gc_collects_the_leftover)
        with pytest.raises(errors.CheckpointError, match="grace period"):
            ctx.upload(make_tree(str(tmp_path / "a"), {"x.bin": b"a" * 9000}))
        assert scan.list_committed(ctx.storage) == []


def test_a_sweep_sends_no_delete_once_its_window_is_closing(tmp_path):
    with CheckpointContext(
        str(tmp_path / "store"), dedup=True, dedup_chunk_bytes=4096, gc_policy=None
    ) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), {"x.bin": b"a" * 9000}))
        ctx.delete(uuid)
        # A window no longer than one request's retry budget leaves no time to delete.
        short = condemned.REQUEST_BUDGET_SECONDS
        assert blob_gc.sweep(ctx.storage, window_seconds=short) == []
        assert stored(ctx)
        [cond] = condemned.read_all(ctx.storage).condemnations.values()
        backdate_condemnation(ctx.storage, cond.name, short + 1)  # closed: condemned again
        assert blob_gc.sweep(ctx.storage)
        assert not stored(ctx)


def test_corrupted_shared_blob_is_reported_with_every_checkpoint_using_it(
    local_and_s3_url, frozen, tmp_path
):
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    with CheckpointContext(
        local_and_s3_url, trial_id=1, dedup=True, dedup_chunk_bytes=CHUNK
    ) as ctx:
        uuids = [
            ctx.upload(make_tree(str(tmp_path / f"s{i}"), tree(i, frozen=frozen))) for i in range(3)
        ]
        shared = blobs.chunk_file(str(tmp_path / "s0" / "model" / "frozen.bin"), CHUNK)[5]
        key = blobs.blob_key(shared["sha256"])
        data = ctx.storage.read_bytes(key)
        local = ctx.storage.local_path(key)
        if local is not None:
            os.chmod(local, 0o644)
        ctx.storage.write_bytes(key, data[:100] + bytes([data[100] ^ 1]) + data[101:])
        with pytest.raises(errors.ChecksumMismatch, match=shared["sha256"]):
            ctx.download(uuids[1], tmp_path / "out")
        result = CliRunner().invoke(
            cli,
            [
                "--storage",
                local_and_s3_url,
                "--registry",
                registry,
                "checkpoint",
                "verify",
                uuids[0],
            ],
            catch_exceptions=False,
        )
        assert result.exit_code == 5, result.output
        assert shared["sha256"] in result.output
        for uuid in uuids:
            assert uuid in result.output


@pytest.mark.parametrize("kind", ["file", "memory", "s3", "gcs", "azure"])
def test_dedup_is_on_by_default_on_every_storage(storage_url_factory, tmp_path, kind):
    url = storage_url_factory(kind)
    tree = make_tree(str(tmp_path / "a"), {"x": b"1" * 10_000})
    with CheckpointContext(url) as ctx:
        assert ctx.dedup is True
        uuid = ctx.upload(tree)
        assert fmt.read_manifest(ctx.storage, uuid)["format_version"] == fmt.BLOBS_FORMAT_VERSION
        assert ctx.storage.list(blobs.BLOBS_DIR)
    # dedup=False stores whole files (format 1), beside the deduplicated ones.
    with CheckpointContext(url, dedup=False) as ctx:
        uuid = ctx.upload(tree)
        assert fmt.read_manifest(ctx.storage, uuid)["format_version"] == fmt.FORMAT_VERSION
        ctx.download(uuid, str(tmp_path / "back"))
        assert read_tree(str(tmp_path / "back"))["x"] == b"1" * 10_000


def test_a_storage_dict_dedup_key_turns_it_off_and_is_checked(storage_url_factory, tmp_path):
    bucket = storage_url_factory("s3").split("://", 1)[1].split("/", 1)[0]
    config = {"type": "s3", "bucket": bucket, "prefix": "root", "save_trial_latest": 1}
    with CheckpointContext({**config, "dedup": False}) as ctx:
        assert ctx.dedup is False
    with CheckpointContext(config) as ctx:
        assert ctx.dedup is True
    with ckptstore.core.init(
        storage={**config, "dedup": False}, registry=f"sqlite:///{tmp_path}/r.db"
    ) as core_ctx:
        assert core_ctx.checkpoint.dedup is False
        with core_ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            pathlib.Path(path, "w.bin").write_bytes(b"w" * 5000)
        assert fmt.read_manifest(core_ctx.checkpoint.storage, uuid)["format_version"] == 1
    with pytest.raises(errors.InvalidStorageConfig, match="dedup must be true or false"):
        CheckpointContext({**config, "dedup": "no"})


def test_the_chunk_size_is_checked(tmp_path):
    with pytest.raises(errors.InvalidConfig, match="dedup_chunk_bytes"):
        CheckpointContext(str(tmp_path / "s"), dedup=True, dedup_chunk_bytes=10)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20_000), min_size=1, max_size=4),
    drop=st.integers(0, 3),
)
def test_manifest_blob_lists_must_add_up(sizes, drop):
    """A manifest whose blob list does not add up to the file size is refused, typed."""
    entry = {"size": sum(sizes), "crc32c": "00000000"}
    entry["blobs"] = [{"sha256": f"{i:064x}", "size": s} for i, s in enumerate(sizes)]
    manifest = {"format_version": 2, "uuid": None, "files": {"f": entry}}
    assert fmt.parse_manifest(json.dumps(manifest).encode(), "u")["files"]["f"] == entry
    damaged = dict(entry, blobs=entry["blobs"][: len(sizes) - 1 - min(drop, len(sizes) - 1)])
    if sum(c["size"] for c in damaged["blobs"]) != entry["size"]:
        bad = {"format_version": 2, "uuid": None, "files": {"f": damaged}}
        with pytest.raises(errors.InvalidCheckpoint, match="blob list"):
            fmt.parse_manifest(json.dumps(bad).encode(), "u")
    old = {"format_version": 1, "uuid": None, "files": {"f": entry}}
    with pytest.raises(errors.InvalidCheckpoint, match="format_version=1"):
        fmt.parse_manifest(json.dumps(old).encode(), "u")


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(0, 300_000),
    cuts=st.lists(st.integers(-10, 310_000), max_size=30),
    chunk=st.sampled_from([4096, 10_000, 65_536]),
)
def test_cut_ranges_cover_the_file_and_respect_the_cuts(size, cuts, chunk):
    ranges = blobs.cut_ranges(size, cuts, chunk)
    assert sum(n for _, n in ranges) == size
    assert all(n > 0 for _, n in ranges)
    pos = 0
    for offset, n in ranges:
        assert offset == pos  # contiguous, in order
        pos += n
        assert n <= max(chunk, blobs.MERGE_BYTES)
    starts = {o for o, _ in ranges}
    pieces = sorted({c for c in cuts if 0 < c < size} | {0, size})
    for a, b in zip(pieces, pieces[1:], strict=False):
        if b - a > blobs.ALONE_BYTES:  # a piece worth a chunk starts one ...
            assert a in starts
            if b - a <= chunk:  # ... and ends one (unless split, with a tiny remainder)
                assert b == size or b in starts


def test_a_changed_piece_costs_its_own_bytes_when_the_writer_gives_cuts(tmp_path):
    """A file laid out like a model (big tensors, tiny headers between them): with the cut
    offsets, changing one tensor uploads that tensor's bytes, whatever the chunk size."""
    sizes = [300_000, 40_000, 5_000_000, 24, 70_000, 9]
    header = 500

    def layout(changed: int | None) -> tuple[bytes, list[int]]:
        out, cuts = bytearray(), []
        for i, n in enumerate(sizes):
            out += bytes([i]) * header
            cuts.append(len(out))
            seed = (i, 1 if i == changed else 0)
            out += random.Random(str(seed)).randbytes(n)
            cuts.append(len(out))
        return bytes(out), cuts

    with CheckpointContext(str(tmp_path / "s"), dedup=True, gc_policy=None) as ctx:
        data, cuts = layout(None)
        with ctx.store_path({"steps_completed": 1}, cuts={"m.bin": cuts}) as (path, _u1):
            (path / "m.bin").write_bytes(data)
        before = stored(ctx)
        for changed in (1, 4):
            data, cuts = layout(changed)
            with ctx.store_path({"steps_completed": 2}, cuts={"m.bin": cuts}) as (path, uuid):
                (path / "m.bin").write_bytes(data)
            new = stored(ctx) - before
            assert (
                sum(len(ctx.storage.read_bytes(blobs.blob_key(s))) for s in new) == sizes[changed]
            )
            before |= new
            ctx.download(uuid, tmp_path / f"d{changed}")
            assert (tmp_path / f"d{changed}" / "m.bin").read_bytes() == data
        chunks = fmt.read_manifest(ctx.storage, uuid)["files"]["m.bin"]["blobs"]
        # 5 MB split at 4 MiB, the tiny 24 and 9 byte pieces merged with their headers.
        assert len(chunks) == len(sizes) + 1 + 3


class CountingStorage:
    """Counts the requests made through a storage (wraps it; everything else passes)."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        self._inner = inner
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        attr = getattr(self._inner, name)
        if name in {
            "exists",
            "file_exists",
            "write_if_absent",
            "write_range_if_absent",
            "list",
            "write_bytes",
            "read_bytes",
        }:

            def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                with self._lock:  # upload threads call concurrently
                    self.calls[name] = self.calls.get(name, 0) + 1
                return attr(*args, **kwargs)

            return counted
        return attr


def test_blobs_the_last_commit_named_cost_no_request_unless_gc_condemned_them(tmp_path, frozen):
    from ckptstore.checkpointing import commit

    storage_url = str(tmp_path / "s")
    with CheckpointContext(storage_url, gc_policy=None) as ctx:
        counting = CountingStorage(ctx.storage)
        known = blobs.KnownBlobs()
        uuids = [f"0b7c6f5e-0000-4000-8000-00000000000{i}" for i in range(4)]
        for i in range(3):
            counting.calls.clear()
            src = make_tree(str(tmp_path / f"t{i}"), tree(i + 1, frozen=frozen))
            commit.commit_dir(
                counting,  # type: ignore[arg-type]
                uuids[i],
                src,
                {"steps_completed": i},
                dedup_chunk_bytes=CHUNK,
                known_blobs=known,
            )
            calls = dict(counting.calls)
            # One create-only write per new chunk (4 of the head, 1 config), none per reused
            # one; no stat (the marker is read back once before the commit); one listing of
            # the condemnations (plus, on the first commit, one of the blobs).
            new_chunks = 20 + 5 if i == 0 else 5
            # A chunk is created from its range of the staged file, the manifest from bytes.
            assert calls["write_range_if_absent"] == new_chunks, calls
            assert calls["write_if_absent"] == 1, calls
            assert calls.get("exists", 0) == 0, calls
            assert calls.get("file_exists", 0) == 0, calls
            assert calls.get("read_bytes", 0) == 1, calls
            assert calls.get("list", 0) == (2 if i == 0 else 1), calls
        # GC condemns and deletes every blob this writer believes in: its next commit does not
        # trust that belief and creates them again.
        for uuid in uuids[:3]:
            ctx.delete(uuid)
        assert blob_gc.sweep(ctx.storage)
        src = make_tree(str(tmp_path / "t3"), tree(4, frozen=frozen))
        commit.commit_dir(
            ctx.storage, uuids[3], src, {}, dedup_chunk_bytes=CHUNK, known_blobs=known
        )
        ctx.download(uuids[3], tmp_path / "out")
        assert (tmp_path / "out" / "model" / "frozen.bin").read_bytes() == frozen


class SlowReads:
    """Wraps a storage: blob reads take a while; records how many ran at once."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        self._inner = inner
        self._lock = threading.Lock()
        self.running = self.most = 0

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._inner, name)

    def read_into(self, key, fd, offset, check=None):  # type: ignore[no-untyped-def]
        # What a reassembly calls per chunk (a local store copies the chunk in the kernel).
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.02)
            return self._inner.read_into(key, fd, offset, check)
        finally:
            with self._lock:
                self.running -= 1


def test_assemble_reads_chunks_in_parallel_and_names_a_damaged_or_missing_one(tmp_path, frozen):
    with CheckpointContext(
        str(tmp_path / "s"), dedup=True, dedup_chunk_bytes=CHUNK, gc_policy=None
    ) as ctx:
        files = tree(1, frozen=frozen)
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), files))
        manifest = fmt.load_manifest(ctx.storage, uuid)
        slow = SlowReads(ctx.storage)
        out = str(tmp_path / "out")
        written = blobs.assemble(slow, uuid, manifest, out, lambda rel: True, workers=4)  # type: ignore[arg-type]
        assert written == {rel: len(data) for rel, data in files.items()}
        assert {k: v for k, v in read_tree(out).items() if k in files} == files
        fmt.verify_files(out, manifest, lambda rel: rel in files)
        assert 1 < slow.most <= 4  # in parallel, never more chunks in memory than threads
        chunks = blobs.chunks_of(manifest.files["model/frozen.bin"])
        # A corrupted chunk: the same typed error, naming the chunk and the file.
        key = blobs.blob_key(chunks[3].sha256)
        data = ctx.storage.read_bytes(key)
        os.chmod(ctx.storage.local_path(key), 0o644)
        ctx.storage.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(errors.ChecksumMismatch, match=chunks[3].sha256) as caught:
            blobs.assemble(ctx.storage, uuid, manifest, out, lambda rel: True)
        assert caught.value.blob == chunks[3].sha256  # type: ignore[attr-defined]
        assert f"{uuid}/model/frozen.bin" in str(caught.value)
        # A missing chunk.
        ctx.storage.delete(blobs.blob_key(chunks[9].sha256))
        ctx.storage.write_bytes(key, data)
        with pytest.raises(errors.ChecksumMismatch, match="missing") as caught:
            blobs.assemble(ctx.storage, uuid, manifest, out, lambda rel: True)
        assert caught.value.blob == chunks[9].sha256  # type: ignore[attr-defined]


def test_storage_validate_checks_the_blob_store(tmp_path, frozen):
    url = str(tmp_path / "s")
    registry = f"sqlite:///{tmp_path / 'reg.db'}"
    with CheckpointContext(url, trial_id=1, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuids = [
            ctx.upload(make_tree(str(tmp_path / f"s{i}"), tree(i, frozen=frozen))) for i in range(3)
        ]
        storage = ctx.storage

    def validate(*extra: str):  # type: ignore[no-untyped-def]
        args = ["--storage", url, "--registry", registry, "storage", "validate", *extra]
        return CliRunner().invoke(cli, args, catch_exceptions=False)

    ok = validate("--blobs", "all")
    assert ok.exit_code == 0, ok.output
    assert "read back with a matching SHA-256" in ok.output
    shared = blobs.chunk_file(str(tmp_path / "s0" / "model" / "frozen.bin"), CHUNK)
    damaged, missing = shared[2]["sha256"], shared[11]["sha256"]
    key = blobs.blob_key(damaged)
    data = storage.read_bytes(key)
    os.chmod(storage.local_path(key), 0o644)
    storage.write_bytes(key, bytes([data[0] ^ 1]) + data[1:])
    bad = validate("--blobs", "all")
    assert bad.exit_code == 5, bad.output
    assert f"Blob {damaged} is damaged" in bad.output
    assert all(u in bad.output for u in uuids)
    # A missing chunk is found without reading any (one listing).
    storage.write_bytes(key, data)
    storage.delete(blobs.blob_key(missing))
    gone = validate("--blobs", "0")
    assert gone.exit_code == 5, gone.output
    assert f"Blob {missing} is missing" in gone.output
    assert all(u in gone.output for u in uuids)
    assert blob_gc.check(storage, 0)["missing"] == {missing: sorted(uuids)}
    assert validate("--blobs", "x").exit_code == 2


def test_a_local_store_copies_chunks_in_the_kernel(tmp_path, frozen, monkeypatch):
    """On a local store a new chunk is copied from its range of the staged file, and a
    restore copies each checked chunk into place, inside the kernel (``copy_file_range``: no
    Python buffer per chunk; blocks shared where the file system has reflinks)."""
    from ckptstore.storage_backends import local

    copies: list[tuple[int, int]] = []  # (bytes, destination offset)
    real = local.copy_range

    def counted(src, dst, count, src_offset, dst_offset):  # type: ignore[no-untyped-def]
        copies.append((count, dst_offset))
        return real(src, dst, count, src_offset, dst_offset)

    monkeypatch.setattr(local, "copy_range", counted)
    with CheckpointContext(
        str(tmp_path / "s"), dedup=True, dedup_chunk_bytes=CHUNK, gc_policy=None
    ) as ctx:
        files = tree(1, frozen=frozen)
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), files))
        chunks = [
            c
            for e in fmt.read_manifest(ctx.storage, uuid)["files"].values()
            for c in e.get("blobs", ())  # folders ("dir/") have none
        ]
        unique = {c["sha256"]: c["size"] for c in chunks}
        # One copy per chunk created, of that chunk's size, into a new file.
        assert sorted(copies) == sorted((size, 0) for size in unique.values())
        copies.clear()
        ctx.download(uuid, tmp_path / "out")
        got = read_tree(str(tmp_path / "out"))
        assert {rel: data for rel, data in got.items() if rel in files} == files
        assert sorted(n for n, _ in copies) == sorted(c["size"] for c in chunks)


@settings(max_examples=12, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=40_000),
    cuts=st.lists(st.integers(0, 40_000), max_size=6),
    writes=st.randoms(use_true_random=False),
    how=st.sampled_from(["linked", "whole", "in_place", "threatened"]),
)
def test_a_file_written_as_its_chunks_commits_its_bytes_on_every_path(
    tmp_path_factory, data, cuts, writes, how
):
    """A writer that writes a file as its chunks (blobs.SplitFile, writes in any order and
    across chunk bounds) commits exactly those bytes: new chunks linked into the blob folder
    (nothing copied), or the parts joined into the file where it is stored whole (dedup off,
    a folder served in place, blobs a running sweep may delete)."""
    from ckptstore.checkpointing import commit
    from ckptstore.storage_backends import local

    root = tmp_path_factory.mktemp("split")
    rel = "saved_model/v.bin" if how == "in_place" else "m.bin"
    copied: list[int] = []
    real_copy = local.copy_range
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "copy_range", lambda *a: copied.append(a[2]) or real_copy(*a))
        if how == "threatened":
            real = commit._whole_where_threatened
            patch.setattr(
                commit,
                "_whole_where_threatened",
                lambda entries, unsafe: real(entries, frozenset(blobs.chunk_shas(entries))),
            )
        with CheckpointContext(
            str(root / "s"), dedup=how != "whole", dedup_chunk_bytes=4096, gc_policy=None
        ) as ctx:
            with ctx.store_path(
                {"steps_completed": 1}, checksums={rel: ckpt_checksums.crc32c_bytes(data)}
            ) as (
                path,
                uuid,
            ):
                os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
                out = blobs.SplitFile(
                    str(path), rel, len(data), blobs.cut_ranges(len(data), cuts, 4096)
                )
                pieces = [(o, data[o : o + 3000]) for o in range(0, len(data), 3000)]
                writes.shuffle(pieces)
                for offset, piece in pieces:
                    out.pwrite(piece, offset)
                out.close()
            entry = fmt.read_manifest(ctx.storage, uuid)["files"][rel]
            assert ("blobs" in entry) == (how == "linked")
            if how == "linked":
                assert copied == []  # every chunk linked, none copied
            ctx.download(uuid, str(root / "out"))
            assert (root / "out" / rel).read_bytes() == data
            assert not [n for n in os.listdir(root / "s") if n.startswith(fmt.STAGING_PREFIX)]
            if how == "linked":
                _commit_again_from_stored_blobs(ctx, rel, data, entry["blobs"], root)


def _commit_again_from_stored_blobs(ctx, rel, data, chunks, root):  # type: ignore[no-untyped-def]
    """A second checkpoint of the same bytes whose writer takes every other chunk from its
    stored blob (SplitFile.link_blob: what the Keras writer does for a frozen tensor) and
    writes the rest: nothing is rewritten, and the file reads back the same."""
    ranges, offset = [], 0
    for chunk in chunks:
        ranges.append((offset, chunk["size"]))
        offset += chunk["size"]
    with ctx.store_path(
        {"steps_completed": 2}, checksums={rel: ckpt_checksums.crc32c_bytes(data)}
    ) as (
        path,
        uuid,
    ):
        blob_dir = ctx.storage.local_path(blobs.BLOBS_DIR)
        out = blobs.SplitFile(str(path), rel, len(data), ranges, blob_dir=blob_dir)
        for i, ((start, length), chunk) in enumerate(zip(ranges, chunks, strict=True)):
            if i % 2 == 0:
                assert out.link_blob(i, chunk["sha256"])
                assert not out.link_blob(i, chunk["sha256"])  # taken already
            else:
                out.pwrite(data[start : start + length], start)
                assert out.digests[i] == chunk["sha256"]  # hashed while written
        out.close()
        linked = [p for _o, _n, p in blobs.split_files(str(path))[rel]][::2]
        stored = [os.path.join(blob_dir, c["sha256"][:2], c["sha256"]) for c in chunks[::2]]
        assert all(map(os.path.samefile, linked, stored))  # the blobs themselves: no copy
    assert fmt.read_manifest(ctx.storage, uuid)["files"][rel]["blobs"] == chunks
    ctx.download(uuid, str(root / "again"))
    assert (root / "again" / rel).read_bytes() == data
