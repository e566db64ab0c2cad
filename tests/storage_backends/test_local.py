"""Local-backend specifics: in-place paths, atomic rename of a staging folder, O_EXCL creates."""

import os

import pytest

from ckptstore.errors import InvalidStorageConfig, InvalidStoragePath, StorageNotFound
from ckptstore.storage_backends import open_storage
from ckptstore.storage_backends.local import LocalStorage


def test_plain_path_and_file_url_are_the_same_root(tmp_path):
    a = open_storage(str(tmp_path))
    b = open_storage(f"file://{tmp_path}")
    assert isinstance(a, LocalStorage) and isinstance(b, LocalStorage)
    assert a.root == b.root == str(tmp_path)
    assert a.url == f"file://{tmp_path}"


def test_file_url_with_host_is_rejected():
    with pytest.raises(InvalidStorageConfig, match="three slashes"):
        open_storage("file://server/share")


def test_local_path_validates_key(tmp_path):
    storage = open_storage(tmp_path)
    assert storage.local_path("a/b") == os.path.join(str(tmp_path), "a", "b")
    with pytest.raises(InvalidStoragePath):
        storage.local_path("../escape")


def test_rename_dir_into_moves_staging_folder(tmp_path):
    storage = open_storage(tmp_path / "store")
    staging = tmp_path / "staging"
    (staging / "sub").mkdir(parents=True)
    (staging / "sub" / "w.bin").write_bytes(b"123")
    assert storage.rename_dir_into(str(staging), "exp/ckpt1") is True
    assert not staging.exists()
    assert storage.list("exp/ckpt1") == {"sub/w.bin": 3}


def test_rename_dir_into_refuses_non_empty_target(tmp_path):
    storage = open_storage(tmp_path / "store")
    storage.write_bytes("ckpt/old.txt", b"old")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "new.txt").write_bytes(b"new")
    assert storage.rename_dir_into(str(staging), "ckpt") is False
    assert staging.exists()
    assert storage.list("ckpt") == {"old.txt": 3}


def test_write_if_absent_leaves_no_temp_files(tmp_path):
    storage = open_storage(tmp_path)
    assert storage.write_if_absent("lock", b"one") is True
    assert storage.write_if_absent("lock", b"two") is False
    assert storage.read_bytes("lock") == b"one"
    assert sorted(os.listdir(tmp_path)) == ["lock"]


def test_missing_root_lists_empty_and_download_raises(tmp_path):
    storage = open_storage(tmp_path / "never")
    assert storage.list("") == {}
    assert storage.exists("x") is False
    with pytest.raises(StorageNotFound, match="Nothing found"):
        storage.download("x", str(tmp_path / "out"))


def test_delete_whole_key_and_file_key(tmp_path):
    storage = open_storage(tmp_path)
    storage.write_bytes("a/b/c.txt", b"x")
    storage.write_bytes("f.txt", b"y")
    assert storage.delete("a") == {}
    assert storage.delete("f.txt") == {}
    assert storage.list("") == {}
    assert storage.delete("never/there") == {}
