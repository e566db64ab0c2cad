"""Writes past the page cache (direct_writes.PartWriter): the file holds exactly the bytes
written, whatever their order, and a run written in order goes to the disk directly."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.checkpointing import blobs
from ckptstore.checkpointing import direct_writes as dw


def _direct_supported(folder: str) -> bool:
    probe = os.path.join(folder, "probe")
    out = dw.PartWriter(probe, dw.Bounce(), size=dw.DIRECT_MIN_BYTES)
    out.pwrite(b"\0" * dw.ALIGN, 0)
    out.close()
    os.unlink(probe)
    return out.direct_bytes == dw.ALIGN


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 3 * dw.BOUNCE_BYTES + 5000),
    piece=st.sampled_from([1000, 4096, 70_000, dw.BOUNCE_BYTES]),
    late=st.sets(st.integers(0, 40), max_size=3),
)
def test_a_part_holds_exactly_its_bytes_and_an_ordered_run_goes_direct(
    tmp_path_factory, size, piece, late
):
    """Pieces written in order, except a few held back and written last (as the zip's first
    header is): the file reads back byte for byte; the pieces before the first held back,
    in whole blocks, went to the disk past the page cache (where the file system allows)."""
    folder = str(tmp_path_factory.mktemp("direct"))
    data = os.urandom(size)
    pieces = [(o, data[o : o + piece]) for o in range(0, size, piece)]
    held = [p for i, p in enumerate(pieces) if i in late]
    path = os.path.join(folder, "part")
    out = dw.PartWriter(path, dw.Bounce(), size)
    for offset, chunk in [p for i, p in enumerate(pieces) if i not in late] + held:
        out.pwrite(chunk, offset)
    out.close()
    with open(path, "rb") as f:
        assert f.read() == data
    first_late = min((i for i in late if i < len(pieces)), default=len(pieces)) * piece
    in_order = min(first_late, size)
    if size >= dw.DIRECT_MIN_BYTES and _direct_supported(folder):
        # every whole block of the ordered run, less the partial bounce left at a spill
        assert in_order - in_order % dw.ALIGN - dw.BOUNCE_BYTES <= out.direct_bytes
        assert out.direct_bytes <= in_order - in_order % dw.ALIGN
    else:
        assert out.direct_bytes == 0


def test_a_split_file_writes_its_chunks_past_the_page_cache_with_their_sha256(tmp_path):
    """SplitFile (the local deduplicated writer of model.keras) writes large chunks directly,
    and each part still carries the SHA-256 of its bytes (the commit reads nothing back)."""
    import hashlib

    if not _direct_supported(str(tmp_path)):
        pytest.skip("this file system does not take O_DIRECT writes")
    data = os.urandom(9 * 2**20 + 777)
    cuts = [512, 3 * 2**20 + 5]
    ranges = blobs.cut_ranges(len(data), cuts, 4 * 2**20)
    out = blobs.SplitFile(str(tmp_path), "m.bin", len(data), ranges)
    written: list[int] = []
    real = dw.PartWriter.close

    def close(self):  # type: ignore[no-untyped-def]
        real(self)
        written.append(self.direct_bytes)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dw.PartWriter, "close", close)
        for offset in range(0, len(data), 2**20):
            out.pwrite(data[offset : offset + 2**20], offset)
        out.close()
    parts = blobs.split_files(str(tmp_path))["m.bin"]
    for offset, length, part in parts:
        with open(part, "rb") as f:
            body = f.read()
        assert body == data[offset : offset + length]
        assert part.endswith(hashlib.sha256(body).hexdigest())
    large = sum(n for _o, n in ranges if n >= dw.DIRECT_MIN_BYTES)
    assert sum(written) >= large - len(ranges) * dw.ALIGN
