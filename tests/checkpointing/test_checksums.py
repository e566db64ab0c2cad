"""``checksums.file_sums``: one read gives a file's CRC-32C and SHA-256, whichever path it
takes (inline for small files, SHA-256 on a second thread with two buffers for large ones)."""

from __future__ import annotations

import hashlib
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.checkpointing import checksums

CHUNK = 4096  # the read size under test: a few chunks make the overlapped path


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=5 * CHUNK + 7),
    crc32c=st.booleans(),
    sha256=st.booleans(),
)
def test_one_read_gives_both_digests_at_any_size(data, crc32c, sha256):
    real = checksums._FILE_CHUNK
    checksums._FILE_CHUNK = CHUNK  # module state, restored below (no fixture across examples)
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "f.bin")
            with open(path, "wb") as f:
                f.write(data)
            got = checksums.file_sums(path, crc32c=crc32c, sha256=sha256)
    finally:
        checksums._FILE_CHUNK = real
    assert got == (
        checksums.crc32c_bytes(data) if crc32c else None,
        hashlib.sha256(data).hexdigest() if sha256 else None,
    )
