"""One behaviour for every backend: file, memory, S3 (moto), GCS (fake-gcs-server), Azure
(Azurite). Each test gets a fresh, empty storage URL from ``any_storage_url``."""

from __future__ import annotations

import hashlib
import logging
import os
import threading

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree, read_tree

UNICODE_NAME = "größe/数据 ü.bin"


def _make_tree(root) -> dict[str, bytes]:
    files = {
        "model.keras": os.urandom(3000),
        "metadata.json": b'{"epoch": 3}',
        "empty.txt": b"",
        "sub/deeper/weights.h5": os.urandom(70_000),
        "sub/notes.md": b"# notes\n",
        UNICODE_NAME: "ünïcode".encode(),
    }
    make_tree(root, files)
    (root / "empty_folder").mkdir()
    return files


@pytest.fixture
def storage(any_storage_url):
    with open_storage(any_storage_url) as opened:
        yield opened


def test_tree_round_trip_with_nested_empty_zero_byte_and_unicode(storage, tmp_path):
    src = tmp_path / "src"
    files = _make_tree(src)
    uploaded = storage.upload(str(src), "ckpt-1")
    expected = {rel: len(data) for rel, data in files.items()}
    expected["empty_folder/"] = 0
    assert uploaded == expected
    assert storage.list("ckpt-1") == expected
    assert storage.list("ckpt-1/sub") == {"deeper/weights.h5": 70_000, "notes.md": 8}
    assert storage.list_children("ckpt-1") == ["empty_folder", "größe", "sub"]
    assert storage.exists("ckpt-1") and storage.exists("ckpt-1/sub/notes.md")
    assert not storage.exists("ckpt-2")
    assert storage.read_bytes(f"ckpt-1/{UNICODE_NAME}") == files[UNICODE_NAME]

    dst = tmp_path / "dst"
    seen: list[int] = []
    got = storage.download("ckpt-1", str(dst), progress=seen.append)
    assert got == expected
    assert read_tree(dst) == files
    assert (dst / "empty_folder").is_dir()
    assert sum(seen) == sum(expected.values())
    assert not [n for n in os.listdir(dst) if "ckptstore-tmp" in n]


def test_upload_subset_by_paths(storage, tmp_path):
    files = _make_tree(tmp_path / "src")
    got = storage.upload(str(tmp_path / "src"), "part", paths=["model.keras", "sub/notes.md"])
    assert got == {"model.keras": len(files["model.keras"]), "sub/notes.md": 8}
    assert storage.list("part") == got
    with pytest.raises(errors.StorageNotFound, match="not in"):
        storage.upload(str(tmp_path / "src"), "part", paths=["nope.bin"])


@pytest.mark.parametrize(
    "selector, expected",
    [
        (lambda p: p.endswith(".md"), {"sub/notes.md"}),
        ("*.h5", {"sub/deeper/weights.h5"}),
        (["model.keras", "sub/"], {"model.keras", "sub/deeper/weights.h5", "sub/notes.md"}),
    ],
    ids=["callable", "glob", "globs"],
)
def test_download_with_selector(storage, tmp_path, selector, expected):
    files = _make_tree(tmp_path / "src")
    storage.upload(str(tmp_path / "src"), "sel")
    got = storage.download("sel", str(tmp_path / "dst"), selector=selector)
    assert set(got) == expected
    assert read_tree(tmp_path / "dst") == {rel: files[rel] for rel in expected}


def test_partial_delete_by_globs_returns_exactly_what_remains(storage, tmp_path):
    files = _make_tree(tmp_path / "src")
    storage.upload(str(tmp_path / "src"), "del")
    remaining = storage.delete("del", globs=["sub/*", "*.json"])
    expected = {r: len(d) for r, d in files.items() if not r.startswith("sub/")}
    expected.pop("metadata.json")
    expected["empty_folder/"] = 0
    assert remaining == expected
    assert storage.list("del") == expected
    assert storage.delete("del", globs=["nothing-matches-*"]) == expected
    assert storage.delete("del") == {}
    assert storage.list("del") == {}
    assert not storage.exists("del")
    assert storage.delete("del") == {}  # idempotent


def test_write_if_absent_race_has_exactly_one_winner(storage):
    barrier = threading.Barrier(2)
    results: dict[int, bool] = {}

    def contender(i: int) -> None:
        barrier.wait()
        results[i] = storage.write_if_absent("race/lock.json", f"writer-{i}".encode())

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, True]
    winner = [i for i, won in results.items() if won][0]
    assert storage.read_bytes("race/lock.json") == f"writer-{winner}".encode()
    assert storage.write_if_absent("race/lock.json", b"late") is False


def test_a_chunk_from_a_file_range_and_into_an_open_file(storage, tmp_path):
    """What deduplicated commits and reassembly use: create-only from a byte range of a staged
    file (a local store copies in the kernel), and a checked write at an offset of a file."""
    data = os.urandom(300_000)
    src = tmp_path / "staged.bin"
    src.write_bytes(data)
    assert storage.write_range_if_absent("blobs/a", str(src), 1000, 200_000, durable=False)
    assert storage.read_bytes("blobs/a") == data[1000:201_000]
    assert storage.write_range_if_absent("blobs/a", str(src), 0, 10) is False  # not replaced
    assert storage.read_bytes("blobs/a") == data[1000:201_000]
    with pytest.raises(errors.CheckpointError, match="changed while"):
        storage.write_range_if_absent("blobs/b", str(src), 299_000, 2000)  # past its end
    assert not storage.exists("blobs/b")
    out = tmp_path / "out.bin"
    out.write_bytes(bytes(300_000))
    seen: list[int] = []

    def refuse(chunk: bytes) -> None:
        seen.append(len(chunk))
        raise errors.ChecksumMismatch("refused by the check")

    fd = os.open(out, os.O_WRONLY)
    try:
        assert storage.read_into("blobs/a", fd, 5000) == 200_000
        with pytest.raises(errors.ChecksumMismatch, match="refused"):
            storage.read_into("blobs/a", fd, 0, refuse)  # nothing written when the check fails
        with pytest.raises(errors.StorageNotFound):
            storage.read_into("blobs/none", fd, 0)
    finally:
        os.close(fd)
    got = out.read_bytes()
    assert seen == [200_000]
    assert got == bytes(5000) + data[1000:201_000] + bytes(95_000)


def test_bytes_overwrite_and_not_found(storage, tmp_path):
    storage.write_bytes("a/b.bin", b"one")
    storage.write_bytes("a/b.bin", b"two")
    assert storage.read_bytes("a/b.bin") == b"two"
    assert storage.list("a") == {"b.bin": 3}
    with pytest.raises(errors.StorageNotFound) as info:
        storage.read_bytes("a/missing.bin")
    assert "missing.bin" in str(info.value)
    with pytest.raises(errors.StorageNotFound, match="Nothing found"):
        storage.download("no-such-ckpt", str(tmp_path / "x"))
    assert storage.list("no-such-ckpt") == {}


@pytest.mark.parametrize("bad", ["../escape", "a/../../b", "/abs", "a\\b", "a\x00b", "a//b"])
def test_traversal_is_rejected_everywhere(storage, tmp_path, bad):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x")
    calls = [
        lambda: storage.read_bytes(bad),
        lambda: storage.write_bytes(bad, b"x"),
        lambda: storage.write_if_absent(bad, b"x"),
        lambda: storage.write_range_if_absent(bad, str(tmp_path / "src" / "f"), 0, 1),
        lambda: storage.read_into(bad, 0, 0),
        lambda: storage.list(bad),
        lambda: storage.delete(bad),
        lambda: storage.exists(bad),
        lambda: storage.upload(str(tmp_path / "src"), bad),
        lambda: storage.download(bad, str(tmp_path / "dst")),
        lambda: storage.upload(str(tmp_path / "src"), "ok", paths=[bad]),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidStoragePath):
            call()


def test_validate_leaves_nothing_behind(storage):
    storage.validate()
    assert storage.list("") == {}


def test_secrets_never_in_repr_errors_or_logs(any_storage_url, caplog):
    secret = "Sup3rS3cretValue-do-not-leak"
    kind = any_storage_url.split("://")[0] if "://" in any_storage_url else "file"
    options = {}
    if kind == "s3":
        options = {"access_key": "AKIATESTKEY", "secret_key": secret}
    elif kind == "az":
        conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        options = {"connection_string": conn.replace("AccountKey=", f"AccountKey={secret}")}
    elif kind == "gs":
        options = {"token": "anon", "project": secret}
    caplog.set_level(logging.DEBUG)
    with open_storage(any_storage_url, max_attempts=2, **options) as storage:
        texts = [repr(storage), str(storage), storage.url]
        for call in (
            lambda: storage.read_bytes("missing"),
            lambda: storage.write_bytes("x", b"1"),
            lambda: storage.list(""),
        ):
            try:
                call()
            except errors.CkptstoreError as exc:
                texts.append(str(exc))
                texts.append(repr(exc))
    texts.extend(r.getMessage() for r in caplog.records)
    assert not [t for t in texts if secret in t]


@pytest.mark.slow
def test_large_file_goes_multipart_and_round_trips(any_storage_url, tmp_path):
    size = 64 * 2**20 + 12345
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(data)
    (tmp_path / "src" / "small.txt").write_bytes(b"small")
    options = {"part_size": 16 * 2**20, "multipart_threshold": 32 * 2**20, "concurrency": 4}
    with open_storage(any_storage_url, **options) as storage:
        assert storage.upload(str(tmp_path / "src"), "big") == {"big.bin": size, "small.txt": 5}
        assert storage.list("big") == {"big.bin": size, "small.txt": 5}
        if storage.scheme == "s3":  # a multipart upload's ETag ends in -<parts>
            head = storage._client.head_object(
                Bucket=storage.bucket, Key=storage._name("big/big.bin")
            )
            assert head["ETag"].strip('"').endswith("-5")
        storage.download("big", str(tmp_path / "dst"))
    got = (tmp_path / "dst" / "big.bin").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_modified_at_is_the_storages_own_clock(storage):
    """GC judges ages by these stamps only (never a writer's clock): they exist on every
    backend, follow writes, and a missing object is StorageNotFound."""
    import time

    storage.write_bytes("stamp/a", b"1")
    first = storage.modified_at("stamp/a")
    assert abs(first - time.time()) < 300  # the emulators run on this machine's clock
    time.sleep(1.1)  # S3 stamps whole seconds
    storage.write_bytes("stamp/a", b"2")
    assert storage.modified_at("stamp/a") > first
    assert storage.write_if_absent("stamp/b", b"x", durable=False)
    assert storage.modified_at("stamp/b") >= first
    with pytest.raises(errors.StorageNotFound):
        storage.modified_at("stamp/missing")
