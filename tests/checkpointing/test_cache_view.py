"""A remote checkpoint's file read in place from the restore cache (``.cache_view``): a warm
load reads the cached file through a descriptor, with no reassembled copy, no link into a
folder and no second hash of the file; a damaged cached file is dropped and fetched again."""

from __future__ import annotations

import logging
import os

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, blobs, cache_view
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import format as fmt
from tests._helpers.trees import make_tree
from tests.checkpointing._helpers import same_crc32c

CHUNK = 2**16
BIG = "model.keras"


def files(seed: int) -> dict[str, bytes]:
    rng = __import__("random").Random(seed)
    return {BIG: rng.randbytes(5 * CHUNK + 123), "other.bin": b"x" * 10}


@pytest.fixture
def reassembled(monkeypatch):
    """Relative paths of the deduplicated files a download reassembled from their chunks
    into a folder while the fixture is active."""
    seen: list[str] = []
    real = blobs.assemble

    def spy(storage, uuid, manifest, local_dir, select, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend(
            rel for rel in manifest.files if blobs.is_chunked(manifest.files[rel]) and select(rel)
        )
        return real(storage, uuid, manifest, local_dir, select, **kwargs)

    monkeypatch.setattr(blobs, "assemble", spy)
    return seen


def read_view(url: str, uuid: str) -> tuple[bytes, object, list[str]]:
    """(the bytes read through the view of model.keras, the view, the files in the folder)
    of one read_in_place in a new context (as a new process would)."""
    with CheckpointContext(url) as ctx:
        views: dict[str, object] = {BIG: None}
        with ctx.read_in_place(uuid, selector=[BIG, "metadata.json"], views=views) as folder:
            view = views[BIG]
            data = view.pread(0, view.size) if view is not None else b""
            listed = sorted(os.listdir(folder))
    return data, view, listed


def cache_entry(url: str, uuid: str) -> tuple[cache_mod.RestoreCache, str]:
    with CheckpointContext(url) as ctx:
        entry = fmt.load_manifest(ctx.storage, uuid).files[BIG]
        return ctx.cache, ctx.cache.content_key(entry.chunks)


def loaded_once(url: str, tmp_path, seed: int):  # type: ignore[no-untyped-def]
    """A checkpoint of :func:`files` (``seed``) in ``url``, read once (so cached): its
    UUID, files, the cache and the path of model.keras's entry, made writable."""
    tree = files(seed)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), tree))
    read_view(url, uuid)
    cache, key = cache_entry(url, uuid)
    os.chmod(cache.root / key, 0o644)
    return uuid, tree, cache, cache.root / key


def test_a_warm_load_reads_the_cached_file_in_place(storage_url_factory, tmp_path, reassembled):
    url = storage_url_factory("s3")
    tree = files(1)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), tree))
    # Cold: fetched, verified and moved into the cache; read there (no copy left behind).
    data, view, listed = read_view(url, uuid)
    assert isinstance(view, cache_view.CachedFile) and data == tree[BIG]
    assert listed == ["metadata.json"] and reassembled == [BIG]
    cache, key = cache_entry(url, uuid)
    recorded = cache._recorded(key)
    assert recorded is not None and recorded[0] == cache_mod._ident_of(str(cache.root / key))
    # Warm, twice: read from the cache in place, nothing reassembled, the entry's identity
    # unchanged (so no load hashes it again: one crc32c pass).
    for _ in range(2):
        reassembled.clear()
        data, view, listed = read_view(url, uuid)
        assert isinstance(view, cache_view.CachedFile) and data == tree[BIG]
        assert reassembled == [] and listed == ["metadata.json"]
        assert view.fd == -1  # closed with the context
        assert cache._recorded(key) == recorded
    assert cache.info().hit_rate is not None and cache.info().hit_rate > 0


def test_a_damaged_cached_file_is_dropped_and_fetched_again(
    storage_url_factory, tmp_path, reassembled, caplog
):
    url = storage_url_factory("s3")
    uuid, tree, _cache, path = loaded_once(url, tmp_path, 2)
    damaged = bytearray(path.read_bytes())
    damaged[3 * CHUNK + 5] ^= 1  # the crc32c catches it (its identity changed too)
    path.write_bytes(bytes(damaged))
    reassembled.clear()
    with caplog.at_level(logging.WARNING, logger="ckptstore.checkpointing.cache"):
        data, view, _ = read_view(url, uuid)
    assert "is damaged; dropped" in caplog.text
    assert isinstance(view, cache_view.CachedFile) and data == tree[BIG]
    assert reassembled == [BIG]  # fetched again from storage
    assert path.read_bytes() == tree[BIG]


def test_an_edit_that_keeps_the_crc32c_is_never_read_in_place(storage_url_factory, tmp_path):
    url = storage_url_factory("s3")
    uuid, tree, cache, path = loaded_once(url, tmp_path, 3)
    key = str(path.relative_to(cache.root))
    # A deduplicated file's entry is checked by its chunks (verified as they were fetched),
    # so its insertion hashed no whole file; a file repeating a chunk keeps a whole SHA-256.
    assert cache._recorded(key)[1] == cache_mod.BY_CHUNKS
    assert cache_mod._content_record(str(path), [("a", 0), ("a", 9)]) != cache_mod.BY_CHUNKS
    # The same bytes rewritten (a new identity): served once its chunks' SHA-256 match, then
    # known again by its identity.
    path.write_bytes(path.read_bytes())
    data, view, _ = read_view(url, uuid)
    assert isinstance(view, cache_view.CachedFile) and data == tree[BIG]
    assert cache._recorded(key)[0] == cache_mod._ident_of(str(path))
    # Other bytes with the same size and crc32c: refused, dropped, fetched again.
    model = tree[BIG]
    forged = same_crc32c(b"666" * (len(model) // 3) + b"6" * (len(model) % 3), model)
    with open(path, "r+b") as f:
        f.write(forged)
    data, view, _ = read_view(url, uuid)
    assert data == model and path.read_bytes() == model


def test_without_a_cache_or_with_a_verify_key_nothing_is_read_from_the_cache(
    storage_url_factory, tmp_path
):
    url = storage_url_factory("s3")
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK, cache=False) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), files(4)))
        views: dict[str, object] = {BIG: None}
        with ctx.read_in_place(uuid, selector=[BIG], views=views) as folder:
            assert views[BIG] is None and os.listdir(folder) == [BIG]  # the old path


def test_s3_chunks_stream_into_place_and_a_damaged_blob_is_named(
    storage_url_factory, tmp_path, monkeypatch
):
    from ckptstore.storage_backends import s3

    url = storage_url_factory("s3")
    tree = files(5)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), tree))
        sha = fmt.load_manifest(ctx.storage, uuid).files[BIG].chunks[2].sha256
    whole_reads: list[str] = []
    real = s3.S3Storage._read
    monkeypatch.setattr(
        s3.S3Storage, "_read", lambda self, name: whole_reads.append(name) or real(self, name)
    )
    with CheckpointContext(url, cache=False) as ctx:
        ctx.download(uuid, tmp_path / "ok", selector=[BIG])
        assert (tmp_path / "ok" / BIG).read_bytes() == tree[BIG]
        assert not [n for n in whole_reads if blobs.BLOBS_DIR in n]  # streamed, piece by piece
        # A stored blob with other bytes of its size: the streamed SHA-256 names it.
        ctx.storage.write_bytes(blobs.blob_key(sha), b"\0" * CHUNK)
        with pytest.raises(errors.ChecksumMismatch, match=f"Blob {sha} .* is corrupted"):
            ctx.download(uuid, tmp_path / "bad", selector=[BIG])
        assert not (tmp_path / "bad" / BIG).exists()


def test_a_file_larger_than_the_cache_is_read_from_the_folder_fetched_once(
    storage_url_factory, tmp_path, reassembled
):
    url = storage_url_factory("s3")
    tree = files(6)
    small = cache_mod.RestoreCache(tmp_path / "small-cache", limit=CHUNK)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK, cache=small) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), tree))
        views: dict[str, object] = {BIG: None}
        with ctx.read_in_place(uuid, selector=[BIG], views=views) as folder:
            assert views[BIG] is None and (folder / BIG).read_bytes() == tree[BIG]
    assert reassembled == [BIG]  # once: not moved into the cache, evicted, then fetched again
