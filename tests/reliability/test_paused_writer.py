"""A writer stopped at any step of its commit (SIGSTOP, a laptop asleep, a frozen VM) while GC
removes its folder and sweeps the blobs only it named never commits a checkpoint whose bytes
are gone (issue 40, finding 1): GC fences the folder's commit slot with a tombstone manifest
before it removes anything, so the late writer's create-only manifest write (or an amend's
conditional rewrite) fails with CheckpointConflict.

Each test records the storage requests of one commit, then replays the commit once per request,
pausing the writer just before that request (and once after the last) while a GC with no
grace period runs to completion; then the writer resumes and everything committed must read
back whole."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, amend, blob_gc, blobs, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.collector import collect
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree, read_tree

#: Every storage request a commit, an amend or GC makes goes through one of these.
REQUESTS = (
    "upload",
    "download",
    "list",
    "list_children",
    "delete",
    "exists",
    "file_exists",
    "read_bytes",
    "read_into",
    "write_bytes",
    "write_if_absent",
    "write_range_if_absent",
    "replace_if_unchanged",
    "modified_at",
    "rename_dir_into",
)


class Pauser:
    """Counts the requests made through a storage object; just before request ``at`` it runs
    ``while_paused()`` (what other processes do while this one is stopped)."""

    def __init__(self, storage, while_paused: Callable[[], None]) -> None:
        self.count = 0
        self.at = 0
        self.fired = False
        self.steps: list[str] = []
        self._while_paused = while_paused
        for name in REQUESTS:
            if hasattr(storage, name):
                setattr(storage, name, self._wrap(name, getattr(storage, name)))

    def _wrap(self, name: str, method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            self.count += 1
            self.steps.append(name)
            if self.count == self.at and not self.fired:
                self.fired = True
                self._while_paused()
            return method(*args, **kwargs)

        return call

    def arm(self, at: int) -> None:
        self.count, self.at, self.fired, self.steps = 0, at, False, []


def _gc(url: str) -> None:
    """Another process's GC with no grace period: every uncommitted folder is a leftover."""
    with open_storage(url) as storage:
        collect(storage, policy=None, grace_seconds=0.0)


def _all_committed_read_back(url: str, tmp_path, written: dict[str, dict[str, bytes]]) -> None:
    """Every checkpoint storage calls committed downloads whole (each chunk's SHA-256, each
    file's crc32c), with the bytes its writer gave it."""
    with CheckpointContext(url) as reader:
        assert blob_gc.check(reader.storage)["missing"] == {}
        for uuid in scan.list_committed(reader.storage):
            out = tmp_path / f"read-{uuid}"
            reader.download(uuid, str(out))
            got = read_tree(str(out))
            assert {k: got.get(k) for k in written[uuid]} == written[uuid], uuid


def _content(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {"model.bin": rng.randbytes(6_000), "state/opt.bin": rng.randbytes(300)}


def _save(ctx: CheckpointContext, seed: int, written: dict[str, dict[str, bytes]]) -> str:
    content = _content(seed)
    with ctx.store_path({"steps_completed": seed}) as (path, uuid):
        make_tree(str(path), content)
    written[uuid] = content
    return uuid


@pytest.mark.parametrize("kind", ["file", "s3"])
@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "whole-file"])
def test_a_writer_paused_at_every_step_of_its_commit_never_commits_missing_bytes(
    storage_url_factory, tmp_path, kind, dedup, monkeypatch
):
    # One blob at a time, so a pause at a blob's write stops the whole upload, as a stopped
    # process does.
    monkeypatch.setattr(blobs, "upload", functools.partial(blobs.upload, workers=1))
    outcomes: list[str] = []
    steps: list[str] = []
    at = 0
    while at <= len(steps):  # before each request of the commit, and after the last
        url = storage_url_factory(kind)  # a fresh store: each replay costs the same
        written: dict[str, dict[str, bytes]] = {}
        with CheckpointContext(url, dedup=dedup, dedup_chunk_bytes=4096, gc_policy=None) as ctx:
            pauser = Pauser(ctx.storage, lambda url=url: _gc(url))
            _save(ctx, 0, written)  # a committed checkpoint GC must keep
            pauser.arm(at)
            try:
                _save(ctx, 1, written)
                outcomes.append("committed")
            # The writer learnt GC took its folder (a pause before the staging folder was
            # renamed into place finds it gone on a local store).
            except (errors.CkptstoreError, FileNotFoundError) as exc:
                outcomes.append(type(exc).__name__)
            if at == 0:
                steps = list(pauser.steps)  # the commit's requests, unpaused
                assert "write_if_absent" in steps  # the create-only manifest write
            else:
                assert pauser.fired
        _gc(url)  # GC again after the writer resumed, as the next run's would
        _all_committed_read_back(url, tmp_path / str(at), written)
        at += 1
    # Unpaused, and paused after its last request, the commit commits; a pause past the last
    # liveness check is refused by the fence, not committed.
    assert outcomes[0] == outcomes[-1] == "committed"
    assert "CheckpointConflict" in outcomes, list(zip(["-", *steps], outcomes, strict=True))


def test_a_conditional_replace_writes_only_over_the_bytes_read(any_storage_url):
    """The primitive the fence needs, on every backend: replace only what was read."""
    with open_storage(any_storage_url) as storage:
        assert storage.replace_if_unchanged("c/MANIFEST.json", b"old", b"new") is False  # absent
        assert not storage.exists("c/MANIFEST.json")
        storage.write_bytes("c/MANIFEST.json", b"old")
        assert storage.replace_if_unchanged("c/MANIFEST.json", b"other", b"new") is False
        assert storage.read_bytes("c/MANIFEST.json") == b"old"
        assert storage.replace_if_unchanged("c/MANIFEST.json", b"old", b"new") is True
        assert storage.read_bytes("c/MANIFEST.json") == b"new"
        assert storage.replace_if_unchanged("c/MANIFEST.json", b"old", b"newer") is False


def _delete_then_gc(url: str, uuid: str) -> None:
    with CheckpointContext(url) as other:
        other.delete(uuid)
    _gc(url)


def _sampled(steps: list[str]) -> list[int]:
    """Pause points (1-based request numbers) standing for every step of ``steps``, chosen
    the same way each run: before the first write of each kind up to the manifest's
    conditional rewrite (the marker's write, the first blob writes, the rewrite itself; a
    pause before anything is written is the local case's first step), and before the last
    request (after the rewrite every pause is alike: it committed)."""
    rewrite = steps.index("replace_if_unchanged")
    writes = {n for n in steps[: rewrite + 1] if n.startswith(("write", "replace"))}
    return sorted({steps.index(name) + 1 for name in writes} | {len(steps)})


@pytest.mark.parametrize(
    ("kind", "dedup", "every_step"),
    # A deduplicated amend on S3 is paused before the first write of each kind and the last
    # request (_sampled: 5 of its 15 requests, ~1.1x the whole-file case's time, not ~3x);
    # on local disk, with the same protocol, at every request.
    [("file", True, True), ("file", False, True), ("s3", False, True), ("s3", True, False)],
    ids=["file-dedup", "file-whole-file", "s3-whole-file", "s3-dedup-sampled"],
)
def test_an_amend_paused_at_every_step_while_its_checkpoint_is_deleted_lists_no_missing_file(
    storage_url_factory, tmp_path, kind, dedup, every_step, monkeypatch
):
    """amend/export add files to a committed checkpoint; a delete and GC while it is stopped
    leave it with nothing to rewrite: its conditional manifest rewrite fails."""
    monkeypatch.setattr(blobs, "upload", functools.partial(blobs.upload, workers=1))
    extra = {"saved_model/x.bin": random.Random(7).randbytes(5_000)}
    outcomes: list[str] = []
    steps: list[str] = []
    points = [0]  # unpaused first: it records the steps
    while points:
        at = points.pop(0)
        url = storage_url_factory(kind)
        written: dict[str, dict[str, bytes]] = {}
        with CheckpointContext(url, dedup=dedup, dedup_chunk_bytes=4096, gc_policy=None) as ctx:
            keep = _save(ctx, 0, written)
            uuid = _save(ctx, 1, written)
            pauser = Pauser(ctx.storage, lambda url=url, uuid=uuid: _delete_then_gc(url, uuid))
            pauser.arm(at)
            src = make_tree(str(tmp_path / f"extra{at}"), extra)
            try:
                amend.add_files(ctx.storage, uuid, src, dedup_chunk_bytes=4096)
                outcomes.append("amended")
                written[uuid] = {**written[uuid], **extra}
            except errors.CkptstoreError as exc:
                outcomes.append(type(exc).__name__)
            if at == 0:
                steps = list(pauser.steps)
                points = list(range(1, len(steps) + 1)) if every_step else _sampled(steps)
            else:
                assert pauser.fired
                assert not fmt.is_committed(ctx.storage, uuid)  # deleted while it was paused
        _gc(url)
        _all_committed_read_back(url, tmp_path / f"a{at}", written)
        assert keep in scan.list_committed(open_storage(url))
    assert outcomes[0] == "amended" and "CheckpointConflict" in outcomes, outcomes


class ManifestWrite:
    """Runs ``while_paused(uuid)`` at the manifest write of the next commit: ``"before"`` it
    (the writer stopped after its last liveness check), or ``"retry"``: the create reaches
    storage, its reply is lost (a read timeout) and the storage's own retry policy sends it
    again after ``while_paused`` (the writer stopped inside that retry)."""

    def __init__(self, storage, when: str, while_paused: Callable[[str], None]) -> None:
        self.fired = False
        self._while_paused = while_paused
        if when == "before":
            real = storage.write_if_absent
            storage.write_if_absent = self._before(real)
        else:
            real = storage._write_if_absent  # what the retry policy calls, once per attempt
            storage._write_if_absent = self._lose_reply(real)

    def _is_manifest(self, key: str) -> bool:
        return key.endswith("/" + fmt.MANIFEST_NAME) and not self.fired

    def _before(self, real):
        def call(key, data, **kwargs):
            if self._is_manifest(key):
                self.fired = True
                self._while_paused(key.split("/")[-2])
            return real(key, data, **kwargs)

        return call

    def _lose_reply(self, real):
        import botocore.exceptions

        state = {"sent": False}

        def call(name, data, *args, **kwargs):
            if self._is_manifest(name):
                if not state["sent"]:
                    state["sent"] = True
                    real(name, data, *args, **kwargs)  # reaches storage: committed
                    raise botocore.exceptions.ReadTimeoutError(endpoint_url=name)
                self.fired = True
                self._while_paused(name.split("/")[-2])
            return real(name, data, *args, **kwargs)

        return call


@pytest.mark.parametrize(
    ("kind", "when"),
    # Only object stores retry a request whose reply was lost (a local create is one link()).
    [("file", "before"), ("s3", "before"), ("s3", "retry")],
    ids=["file-paused-before-manifest", "s3-paused-before-manifest", "s3-paused-in-retry"],
)
def test_a_writer_paused_at_its_manifest_write_while_its_checkpoint_is_deleted_commits_nothing(
    storage_url_factory, tmp_path, kind, when
):
    """A delete (``checkpoint delete``, retention, a delete finished by reconcile) while the
    writer is stopped: before its manifest write (the UUID of a PENDING row can be deleted),
    or inside a retry of that write after the first try committed (retention then sees a
    committed checkpoint). The tombstone the delete leaves makes the late create-only write
    fail, however long the pause; without it the write lands on an empty slot and commits a
    checkpoint whose files and blobs are gone."""
    url = storage_url_factory(kind)
    written: dict[str, dict[str, bytes]] = {}
    deleted: list[str] = []

    def delete_then_gc(uuid: str) -> None:
        _delete_then_gc(url, uuid)
        deleted.append(uuid)

    with CheckpointContext(url, dedup_chunk_bytes=4096, gc_policy=None) as ctx:
        keep = _save(ctx, 0, written)
        paused = ManifestWrite(ctx.storage, when, delete_then_gc)
        with pytest.raises(errors.CheckpointConflict, match="removed while its upload"):
            _save(ctx, 1, written)
        assert paused.fired and len(deleted) == 1
        with pytest.raises(errors.CheckpointNotFound, match="deleted"):
            ctx.download(deleted[0], str(tmp_path / "gone"))
        # Listings, reindex's scan and GC's leftover pass take the tombstone for nothing.
        assert scan.list_committed(ctx.storage) == [keep]
        assert [r.uuid for r in scan.scan_checkpoints(ctx.storage)] == [keep]
        # The id of a deleted checkpoint stays fenced; a new save gets a new UUID and commits.
        again = _save(ctx, 2, written)
    _gc(url)
    _all_committed_read_back(url, tmp_path, written)
    assert scan.list_committed(open_storage(url)) == sorted([keep, again])
