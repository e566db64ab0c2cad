"""Background uploads: immediate return, snapshots, bounded in-flight, failures surface."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, LatestN, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.storage_backends.local import LocalStorage
from ckptstore.storage_backends.memory import MemoryStorage
from tests._helpers.trees import make_tree, read_tree


def gated(base: type):
    """A real backend whose commit step (the manifest write) waits for ``gate``, counting how
    many commits run at once. It lets a test hold uploads "in flight" without timing."""

    class Gated(base):
        def __init__(self, url: str) -> None:
            super().__init__(url)
            self.gate = threading.Event()
            self.lock = threading.Lock()
            self.running = 0
            self.max_running = 0
            self.arrived = threading.Semaphore(0)

        def write_if_absent(self, key: str, data: bytes, **kw) -> bool:
            with self.lock:
                self.running += 1
                self.max_running = max(self.max_running, self.running)
            self.arrived.release()
            try:
                assert self.gate.wait(60), "test gate never opened"
                return super().write_if_absent(key, data, **kw)
            finally:
                with self.lock:
                    self.running -= 1

    return Gated


@pytest.fixture(params=("file", "memory"))
def gated_storage(request, storage_url_factory):
    if request.param == "file":
        return gated(LocalStorage)(storage_url_factory("file"))
    return gated(MemoryStorage)(storage_url_factory("memory"))


def test_upload_returns_before_the_upload_finishes(gated_storage, tmp_path):
    src = make_tree(str(tmp_path / "src"), {"w.bin": os.urandom(1000)})
    ctx = CheckpointContext(gated_storage)
    uuid = ctx.upload(src, {"steps_completed": 1}, background=True)
    # upload() returned while the commit is still held at the gate.
    assert gated_storage.arrived.acquire(timeout=60)
    assert not fmt.is_committed(gated_storage, uuid)
    assert ctx.latest_checkpoint() is None
    gated_storage.gate.set()
    ctx.wait()
    assert fmt.is_committed(gated_storage, uuid)
    assert ctx.latest_checkpoint() == uuid
    ctx.close()


def test_overwriting_files_after_upload_returns_does_not_corrupt(gated_storage, tmp_path):
    original = {"w.bin": os.urandom(50_000), "sub/x.txt": b"first"}
    src = make_tree(str(tmp_path / "src"), original)
    ctx = CheckpointContext(gated_storage)
    uuid = ctx.upload(src, background=True)
    # The caller immediately rewrites its files in place, truncates one and adds another.
    with open(os.path.join(src, "w.bin"), "r+b") as f:
        f.write(b"\0" * 50_000)
    with open(os.path.join(src, "sub", "x.txt"), "wb") as f:
        f.write(b"changed")
    make_tree(src, {"late.txt": b"late"})
    gated_storage.gate.set()
    ctx.wait()
    ctx.download(uuid, str(tmp_path / "out"))
    got = read_tree(str(tmp_path / "out"))
    got.pop("metadata.json")
    assert got == original
    ctx.close()


def test_store_path_background_moves_the_folder(gated_storage):
    # The whole-file commit's rename (a deduplicated one moves the folder too, then removes it)
    ctx = CheckpointContext(gated_storage, dedup=False)
    with ctx.store_path({"steps_completed": 4}, background=True) as (path, uuid):
        make_tree(path, {"a.bin": b"abc"})
        inode = os.stat(os.path.join(path, "a.bin")).st_ino
    gated_storage.gate.set()
    ctx.wait()
    assert not os.path.exists(path)  # handed over: nothing left behind
    final = gated_storage.local_path(f"{uuid}/a.bin")
    if final is not None:  # local file system: moved into place, never copied
        assert os.stat(final).st_ino == inode
    assert ctx.get_metadata(uuid)["steps_completed"] == 4
    with ctx.restore_path(uuid) as restored:
        assert read_tree(restored)["a.bin"] == b"abc"
    ctx.close()


def test_in_flight_uploads_are_bounded(gated_storage, tmp_path):
    src = make_tree(str(tmp_path / "src"), {"w.bin": b"w"})
    ctx = CheckpointContext(gated_storage, max_in_flight=2)
    first = [ctx.upload(src, background=True) for _ in range(2)]
    for _ in range(2):
        assert gated_storage.arrived.acquire(timeout=60)
    third: list[str] = []
    caller = threading.Thread(target=lambda: third.append(ctx.upload(src, background=True)))
    caller.start()
    caller.join(timeout=0.5)
    assert caller.is_alive() and not third  # blocked: two uploads are in flight
    gated_storage.gate.set()
    caller.join(timeout=60)
    assert not caller.is_alive() and len(third) == 1
    ctx.wait()
    assert gated_storage.max_running == 2
    assert sorted(scan.list_committed(gated_storage)) == sorted(first + third)
    ctx.close()


def test_wait_reraises_a_failed_upload(storage_url_factory, s3_server, tmp_path):
    storage_url_factory("s3")  # the S3 emulator is running; this bucket does not exist
    src = make_tree(str(tmp_path / "src"), {"w.bin": b"w"})
    ctx = CheckpointContext("s3://ckptstore-no-such-bucket/root", max_in_flight=1)
    uuid = ctx.upload(src, background=True)
    with pytest.raises(errors.BackgroundUploadError, match=uuid) as info:
        ctx.wait()
    assert isinstance(info.value.__cause__, errors.StorageError)
    ctx.wait()  # reported once
    # A failure also surfaces at the next upload call.
    ctx.upload(src, background=True)
    with pytest.raises(errors.BackgroundUploadError):
        ctx.wait()

    def fail_in_background() -> None:
        ctx.upload(src, background=True)
        for future in list(ctx._uploader._futures.values()):  # finished, not yet reported
            with contextlib.suppress(Exception):
                future.result()

    fail_in_background()
    with pytest.raises(errors.BackgroundUploadError):
        ctx.upload(src, background=True)
    fail_in_background()
    with pytest.raises(errors.BackgroundUploadError):
        with ctx.store_path():
            pass
    ctx.close()


def test_background_commit_triggers_gc(storage_url_factory, tmp_path):
    src = make_tree(str(tmp_path / "src"), {"w.bin": b"w"})
    with CheckpointContext(storage_url_factory("file"), gc_policy=LatestN(2)) as ctx:
        uuids = [ctx.upload(src, {"steps_completed": s}, background=True) for s in range(5)]
        ctx.wait()
        assert sorted(scan.list_committed(ctx.storage)) == sorted(uuids[-2:])


def test_snapshot_copies_large_files_in_ranges(tmp_path, monkeypatch):
    from ckptstore.checkpointing import uploader

    monkeypatch.setattr(uploader, "_RANGE", 4096)  # many ranges on a small file
    files = {"big.bin": os.urandom(100_000), "d/empty.bin": b"", "d/e/small": b"s"}
    src = make_tree(str(tmp_path / "src"), files)
    uploader.snapshot_dir(src, str(tmp_path / "snap"))
    assert read_tree(str(tmp_path / "snap")) == files
    assert (
        os.stat(tmp_path / "snap" / "big.bin").st_ino
        != os.stat(tmp_path / "src" / "big.bin").st_ino
    )


@pytest.mark.parametrize("background", [False, True])
def test_upload_with_move_hands_the_folder_over(storage_url_factory, tmp_path, background):
    files = {"w.bin": os.urandom(1000), "sub/x": b"x"}
    for kind in ("file", "memory"):
        src = make_tree(str(tmp_path / f"src-{kind}"), files)
        inode = os.stat(os.path.join(src, "w.bin")).st_ino
        # The whole-file layout: a deduplicated commit takes the folder too but stores chunks.
        with CheckpointContext(storage_url_factory(kind), dedup=False) as ctx:
            uuid = ctx.upload(src, {"steps_completed": 1}, background=background, move=True)
            ctx.wait()
            assert not os.path.exists(src)
            with ctx.restore_path(uuid) as path:
                got = read_tree(path)
                if kind == "file":  # renamed into place on a local file system
                    assert os.stat(os.path.join(path, "w.bin")).st_ino == inode
            assert {k: v for k, v in got.items() if k in files} == files
