"""The local restore cache (``ckptstore.checkpointing.cache``) through the one download path:
what a load fetches from storage vs the cache, damaged entries, concurrent loads, eviction."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.cache import LoadStats, RestoreCache
from ckptstore.cli.main import cli
from tests._helpers.trees import make_tree, read_tree

CHUNK = 2**16
FROZEN = 6 * CHUNK  # bytes that do not change between checkpoints N and N+1
HEAD = 40_000  # bytes that do (one chunk: the "changed tensor")


def trees(seed: int) -> list[dict[str, bytes]]:
    """Checkpoints N and N+1: a frozen backbone and a head that changes."""
    rng = __import__("random").Random(seed)
    frozen = rng.randbytes(FROZEN)
    return [
        {"model/backbone.bin": frozen, "model/head.bin": rng.randbytes(HEAD), "cfg.json": b"{}"}
        for _ in range(2)
    ]


def cli_download(storage: str, uuid: str, out: str, *extra: str) -> dict:
    """``ckptstore checkpoint download --json`` in a new process (its own cache state)."""
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", storage, "--registry"]
    cmd += [f"sqlite:///{out}.db", "checkpoint", "download", uuid, "-o", out, "--json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("kind", ["file", "s3", "gcs", "azure"])
def test_the_next_checkpoint_fetches_only_what_changed_and_a_reload_nothing(
    kind, storage_url_factory, tmp_path, monkeypatch
):
    url = storage_url_factory(kind)
    monkeypatch.setenv(cache_mod.CACHE_ENV, "on")  # local storage too (remote: on by default)
    files = trees(1)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        n, n1 = (ctx.upload(make_tree(str(tmp_path / f"src{i}"), t)) for i, t in enumerate(files))
        ctx.download(n, tmp_path / "n")
        first = ctx.last_download
        assert first.from_cache == 0 and first.from_storage == sum(first.files.values())
        # N+1 in a new process: only the changed head and the new metadata come from storage.
        report = cli_download(url, n1, str(tmp_path / "n1"))
        assert FROZEN <= report["bytes_from_cache"]
        assert HEAD <= report["bytes_from_storage"] <= HEAD + 4096  # + metadata.json
        assert {k: v for k, v in read_tree(str(tmp_path / "n1")).items() if k in files[1]} == files[
            1
        ]
        # N+1 again, here: nothing from storage.
        ctx.download(n1, tmp_path / "again")
        assert ctx.last_download.from_storage == 0
        assert ctx.last_download.from_cache == sum(ctx.last_download.files.values())
    from_cli = read_tree(str(tmp_path / "n1"))
    del from_cli["MANIFEST.json"]  # the CLI keeps the manifest beside the files
    assert read_tree(str(tmp_path / "again")) == from_cli
    info = json.loads(CliRunner().invoke(cli, ["cache", "info", "--json"]).output)
    assert info["loads"] == 3 and 0.5 < info["hit_rate"] < 1 and info["entries"] > 0


def test_a_damaged_entry_or_an_edited_hard_link_is_detected_and_fetched_again(
    storage_url_factory, tmp_path, caplog
):
    url = storage_url_factory("s3")
    n, n1 = trees(2)
    backbone = bytearray(n["model/backbone.bin"])
    backbone[5 * CHUNK] ^= 1  # N+1 changes one chunk of the backbone: assembled from N's file
    n1["model/backbone.bin"] = bytes(backbone)
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuids = [ctx.upload(make_tree(str(tmp_path / f"s{i}"), t)) for i, t in enumerate((n, n1))]
        ctx.dedup = False
        whole = ctx.upload(str(tmp_path / "s0"))  # format 1: its files cached whole
        ctx.download(uuids[0], tmp_path / "n")
        ctx.download(whole, tmp_path / "w1")
        assert ctx.cache is not None  # on by default for remote storage
        # Flip a byte of N's cached backbone; edit a downloaded (hard-linked) file in place.
        entry = ctx.cache.root / ctx.cache.content_key(
            fmt.load_manifest(ctx.storage, uuids[0]).files["model/backbone.bin"].chunks
        )
        data = bytearray(entry.read_bytes())
        data[2 * CHUNK + 7] ^= 1
        entry.write_bytes(bytes(data))
        with open(tmp_path / "w1" / "model" / "head.bin", "r+b") as f:
            f.write(b"user edit")
        with caplog.at_level(logging.WARNING, logger="ckptstore.checkpointing.cache"):
            ctx.download(uuids[1], tmp_path / "n1")
            assert ctx.last_download.from_storage >= 2 * CHUNK
            ctx.download(whole, tmp_path / "w2")
            assert ctx.last_download.from_storage == HEAD
        assert caplog.text.count("is damaged; dropped") == 2
        assert not entry.exists()
        for out, files in (("n1", n1), ("w2", n)):
            assert {k: v for k, v in read_tree(str(tmp_path / out)).items() if k in files} == files
        ctx.download(uuids[1], tmp_path / "again")  # what was fetched again was kept
        assert ctx.last_download.from_storage == 0


def test_four_processes_loading_one_checkpoint_at_once(storage_url_factory, tmp_path):
    url = storage_url_factory("s3")
    files = trees(3)[0]
    with CheckpointContext(url, dedup=True, dedup_chunk_bytes=CHUNK) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), files))
    cmd = [sys.executable, "-m", "ckptstore.cli.main", "--storage", url, "--registry"]
    procs = [
        subprocess.Popen(
            [*cmd, f"sqlite:///{tmp_path}/r{i}.db", "checkpoint", "download", uuid]
            + ["-o", str(tmp_path / f"o{i}"), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert report["files"] == len(files) + 1  # and metadata.json
        assert report["bytes_from_storage"] + report["bytes_from_cache"] == report["bytes"]
    for i in range(4):  # each verified by the CLI (crc32c) and byte for byte here
        assert {k: v for k, v in read_tree(str(tmp_path / f"o{i}")).items() if k in files} == files
    info = RestoreCache().info()
    on_disk = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, names in os.walk(os.path.join(info.root, "files"))
        for f in names
    )
    assert info.size == on_disk  # every entry counted once, however many processes wrote it
    assert info.loads == 4


def test_eviction_keeps_the_cache_under_its_limit(storage_url_factory, tmp_path):
    limit = 3 * CHUNK
    cache = RestoreCache(tmp_path / "c", limit=limit)
    with CheckpointContext(storage_url_factory("s3"), dedup_chunk_bytes=CHUNK, cache=cache) as ctx:
        for seed in range(3):
            uuid = ctx.upload(make_tree(str(tmp_path / f"s{seed}"), trees(seed)[0]))
            ctx.download(uuid, tmp_path / f"o{seed}")
            assert cache.info().size <= limit
        ctx.download(uuid, tmp_path / "again")  # the newest entries were kept
        assert ctx.last_download.from_cache > 0


@settings(max_examples=15, deadline=None)
@given(
    loads=st.lists(
        st.lists(st.tuples(st.integers(0, 7), st.integers(1, 400)), min_size=1, max_size=5),
        min_size=1,
        max_size=8,
    ),
    limit=st.integers(0, 1500),
)
def test_lru_accounting(tmp_path_factory, loads, limit):
    """After every load the index counts exactly the files on disk, within the limit, and
    what was evicted is older than what was kept."""
    cache = RestoreCache(tmp_path_factory.mktemp("lru"), limit=limit)
    source = cache.root / "source"
    last_use: dict[str, int] = {}
    for step, load in enumerate(loads):
        stats = LoadStats()
        for key_id, size in load:
            key = f"files/00/{key_id:064x}"
            source.unlink(missing_ok=True)  # a new file: the cache hard-links the last one
            source.write_bytes(b"x" * size)
            cache.put_file(key, str(source))
            stats.use(key)
            last_use[key] = step
        cache.record(stats)
        on_disk = {
            k: os.path.getsize(cache.root / k) for k in last_use if (cache.root / k).exists()
        }
        info = cache.info()
        assert info.size == sum(on_disk.values()) <= limit
        assert info.entries == len(on_disk)
        kept = [last_use[k] for k in on_disk]
        gone = [last_use[k] for k in last_use if k not in on_disk]
        assert not kept or not gone or min(kept) >= max(gone)


def test_opt_out_and_bad_settings(storage_url_factory, tmp_path, monkeypatch):
    url = storage_url_factory("s3")
    with CheckpointContext(url) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "a"), trees(4)[0]))
        ctx.download(uuid, tmp_path / "o1", cache=False)
        ctx.download(uuid, tmp_path / "o2", cache=False)
        assert ctx.last_download.from_cache == 0 and not ctx.last_download.cached
    monkeypatch.setenv(cache_mod.CACHE_ENV, "off")
    with CheckpointContext(url) as ctx:
        assert ctx.cache is None
    assert not os.path.exists(cache_mod.default_root())  # nothing was written
    monkeypatch.setenv(cache_mod.CACHE_ENV, "sometimes")
    with pytest.raises(errors.InvalidConfig, match="'sometimes'"):
        cache_mod.resolve(None, ctx.storage)
    assert cache_mod.parse_size("20GB") == 20 * 10**9
    assert cache_mod.parse_size("1.5KiB") == 1536
    for bad in ("lots", "-1", "", True):
        with pytest.raises(errors.InvalidConfig, match="Received"):
            cache_mod.parse_size(bad)
    result = CliRunner().invoke(cli, ["cache", "clear"])
    assert result.exit_code == 0 and "Cleared" in result.output
    monkeypatch.setenv(cache_mod.SIZE_ENV, "a lot")
    with pytest.raises(errors.InvalidConfig, match="CKPTSTORE_CACHE_SIZE.*'a lot'"):
        RestoreCache()
