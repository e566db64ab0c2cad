"""Issue 40, findings 3 and 6: the restore cache serves a hit only if it is unchanged since
insertion, keeps its folder private to its owner, and counts what a crash left behind."""

from __future__ import annotations

import os
import time

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing.cache import LoadStats, RestoreCache
from tests._helpers.trees import make_tree, read_tree
from tests.checkpointing._helpers import same_crc32c


def test_a_crc_preserving_edit_of_a_linked_download_is_never_served(
    s3_server, storage_url_factory, tmp_path
):
    url = storage_url_factory("s3")
    model = os.urandom(50_000)
    cache = RestoreCache(tmp_path / "cache", limit="1GB")
    with CheckpointContext(url, dedup=False, cache=cache) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), {"model.keras": model}))
        ctx.download(uuid, tmp_path / "a")  # hard-linked with the cache entry
        linked = tmp_path / "a" / "model.keras"
        forged = same_crc32c(b"666" * (len(model) // 3) + b"6" * (len(model) % 3), model)
        os.chmod(linked, 0o644)  # entries are read-only: an edit needs this first
        with open(linked, "r+b") as f:  # in place: the cache entry changes with it
            f.write(forged)
        ctx.download(uuid, tmp_path / "b")
    assert read_tree(str(tmp_path / "b"))["model.keras"] == model


def test_cache_entries_are_read_only_through_their_links(s3_server, storage_url_factory, tmp_path):
    url = storage_url_factory("s3")
    with CheckpointContext(url, dedup=False, cache=RestoreCache(tmp_path / "c")) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), {"w.bin": b"w" * 5000}))
        ctx.download(uuid, tmp_path / "a")
    assert os.stat(tmp_path / "a" / "w.bin").st_mode & 0o222 == 0


def test_the_cache_folder_is_private_and_another_users_is_refused(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = RestoreCache(tmp_path / "fresh")
        fresh.info()
        assert os.stat(fresh.root).st_mode & 0o777 == 0o700
    finally:
        os.umask(old)
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    RestoreCache(loose).info()
    assert os.stat(loose).st_mode & 0o777 == 0o700  # ours: made private
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(errors.InvalidConfig, match="not a folder of yours"):
        RestoreCache(tmp_path / "link").info()
    if os.getuid() == 0:  # root can make a folder another user owns
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, 4242)
        with pytest.raises(errors.InvalidConfig, match="not a folder of yours"):
            RestoreCache(theirs).info()


def test_files_a_crash_left_without_a_row_are_counted_and_evicted(tmp_path):
    cache = RestoreCache(tmp_path / "c", limit=10_000)
    cache.info()  # creates the index
    orphan = cache.root / "files" / "ab" / ("ab" + "0" * 62)
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x" * 50_000)  # written by a load killed before it recorded it
    hour_ago = time.time() - 3600
    os.utime(orphan, (hour_ago, hour_ago))
    cache.record(LoadStats())
    assert not orphan.exists()
    assert cache.info().size == 0
