"""Reading a deduplicated file of a local store in place from its chunk files (issue 41):
``CheckpointContext.read_in_place(views=...)`` gives the same bytes a download gives, checked as
a download checks them, and writes no copy."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, blobs
from ckptstore.keras_io.saving._weights_view import RangeFile

CHUNK = 4096


def commit(root: str, files: dict[str, bytes]) -> str:
    with CheckpointContext(root, dedup=True, dedup_chunk_bytes=CHUNK, gc_policy=None) as ctx:
        with ctx.store_path({"steps_completed": 1}) as (path, uuid):
            for rel, data in files.items():
                with open(os.path.join(path, rel), "wb") as f:
                    f.write(data)
    return uuid


@settings(max_examples=25, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=30_000),
    reads=st.lists(st.tuples(st.integers(0, 31_000), st.integers(0, 9_000)), max_size=8),
)
def test_a_view_reads_the_bytes_a_download_gives(tmp_path_factory, data, reads):
    root = str(tmp_path_factory.mktemp("store"))
    uuid = commit(root, {"m.bin": data, "small.json": b"{}"})
    with CheckpointContext(root) as ctx:
        views: dict[str, object] = {"m.bin": None, "absent.bin": None}
        with ctx.read_in_place(uuid, views=views) as path:
            view = views["m.bin"]
            assert view is not None and views["absent.bin"] is None
            assert sorted(os.listdir(path)) == ["metadata.json", "small.json"]  # no copy
            for offset, size in reads:
                assert view.pread(offset, size) == data[offset : offset + size]
            # what h5py and zipfile get: a seekable file object over a byte range
            base = len(data) // 3
            f = RangeFile(view, base, len(data) - base, "x/model.weights.h5")
            assert str(f).endswith("weights.h5") and f.read() == data[base:]
            for offset, size in reads:
                f.seek(offset)
                buf = bytearray(size)
                got = f.readinto(buf)
                assert bytes(buf[:got]) == data[base:][offset : offset + size]
                assert f.tell() == min(offset + size, max(offset, len(data) - base))


def test_a_damaged_or_missing_chunk_is_named_before_anything_is_read(tmp_path):
    data = random.Random(1).randbytes(5 * CHUNK + 7)
    root = str(tmp_path / "store")
    uuid = commit(root, {"m.bin": data})
    with CheckpointContext(root) as ctx:
        manifest = ctx._manifest(uuid)
    chunks = blobs.chunks_of(manifest.files["m.bin"])
    victim = os.path.join(root, *blobs.blob_key(chunks[2].sha256).split("/"))
    os.chmod(victim, 0o644)
    original = open(victim, "rb").read()
    for damaged in (original[:-1] + bytes([original[-1] ^ 1]), original[:-3], None):
        if damaged is None:
            os.unlink(victim)
        else:
            with open(victim, "wb") as f:
                f.write(damaged)
        with CheckpointContext(root) as ctx:
            with pytest.raises(errors.ChecksumMismatch, match=chunks[2].sha256):
                with ctx.read_in_place(uuid, views={"m.bin": None}):
                    pass
    # verify=False opens the view unchecked, as a download would skip the checks
    with CheckpointContext(root, verify=False) as ctx:
        views: dict[str, object] = {"m.bin": None}
        with ctx.read_in_place(uuid, views=views):
            assert views["m.bin"] is not None
