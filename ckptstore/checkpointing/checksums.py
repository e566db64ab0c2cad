"""CRC-32 (zip) and CRC-32C (checkpoint manifests) over large buffers, without copies.

Writing a checkpoint computes both checksums of every byte it writes, so their speed is part of
what a checkpoint costs. This module picks the fastest implementation installed:

- CRC-32: ``isal`` (Intel ISA-L, several GB/s) when installed, else :func:`zlib.crc32`.
- CRC-32C: the ``libcrc32c`` that ``google-crc32c`` ships, called through :mod:`ctypes` on the
  buffer's memory (``google_crc32c``'s own API only takes ``bytes``, i.e. a copy). Falls back to
  ``google_crc32c.extend`` on a copy when the library cannot be found.

All three release the GIL on large buffers, so a background thread computing them does not hold
up the training thread. :func:`crc32c_combine` / :func:`crc32_combine` give the checksum of a
concatenation from the checksums of its parts (zlib's ``crc32_combine``), so pieces can be
checksummed in any order.

Example::

    import numpy as np
    from ckptstore.checkpointing import checksums as fast_crc

    a = np.arange(1000, dtype=np.float32)
    crc = fast_crc.crc32c_update(0, a)                 # no copy of ``a``
    whole = fast_crc.crc32c_combine(crc, fast_crc.crc32c_update(0, b"x"), 1)
    assert whole == fast_crc.crc32c_update(0, a.tobytes() + b"x")
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import logging
import os
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_CRC32_POLY = 0xEDB88320  # reflected CRC-32 (zip, zlib)
_CRC32C_POLY = 0x82F63B78  # reflected CRC-32C (Castagnoli)

try:  # pragma: no cover - depends on what is installed
    from isal.isal_zlib import crc32 as _crc32_impl

    CRC32_IMPLEMENTATION = "isal"
except ImportError:  # pragma: no cover
    _crc32_impl = zlib.crc32
    CRC32_IMPLEMENTATION = "zlib"


def crc32_update(crc: int, data: Any) -> int:
    """CRC-32 (as in zip files) of ``data`` (any C-contiguous buffer) continuing from ``crc``."""
    return _crc32_impl(data, crc)


@functools.lru_cache(maxsize=1)
def _crc32c_extend() -> Callable[[int, int, int], int] | None:
    """``crc32c_extend(crc, address, length)`` from the shipped libcrc32c, or None."""
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - a dependency of ckptstore
        return None
    base = os.path.dirname(os.path.abspath(google_crc32c.__file__))
    candidates: list[str] = []
    for folder in (base + ".libs", os.path.join(os.path.dirname(base), ".dylibs"), base):
        candidates += sorted(glob.glob(os.path.join(folder, "libcrc32c*")))
    for path in candidates:
        try:
            fn = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        probe = b"123456789"
        if fn(0, probe, len(probe)) == 0xE3069283:  # the CRC-32C check value
            return fn
    logger.debug("libcrc32c not found next to google_crc32c; CRC-32C will copy buffers.")
    return None


def crc32c_update(crc: int, data: Any) -> int:
    """CRC-32C of ``data`` (bytes or any C-contiguous buffer) continuing from ``crc``."""
    if isinstance(data, bytes):
        import google_crc32c

        return google_crc32c.extend(crc, data)
    array = np.frombuffer(data, dtype=np.uint8)  # zero-copy view of any buffer
    if array.size == 0:
        return crc
    fn = _crc32c_extend()
    if fn is None:
        import google_crc32c

        return google_crc32c.extend(crc, array.tobytes())
    return fn(crc, array.ctypes.data, array.size)


# ---- combining checksums of consecutive pieces (zlib's crc32_combine, any reflected CRC) -------
def _multmodp(a: int, b: int, poly: int) -> int:
    """a * b modulo the polynomial (reflected bit order)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return p


@functools.lru_cache(maxsize=4)
def _x2n_table(poly: int) -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial for k = 0..66 (lengths up to 2^64 bytes). zlib keeps 32
    entries and wraps k at 32, which holds for CRC-32's polynomial but not for CRC-32C's
    (x^(2^32) is not x modulo it): combining a piece of 512 MiB or more went wrong."""
    p = 1 << 30  # x^1
    table = []
    for _ in range(67):
        table.append(p)
        p = _multmodp(p, p, poly)
    return tuple(table)


def _x8nmodp(n: int, poly: int) -> int:
    """x^(8 n) modulo the polynomial (0 <= n < 2^64)."""
    table = _x2n_table(poly)
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(table[k], p, poly)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32C of ``A + B`` from ``crc1`` = CRC-32C(A), ``crc2`` = CRC-32C(B), ``len2`` = len(B)."""
    return _multmodp(_x8nmodp(len2, _CRC32C_POLY), crc1, _CRC32C_POLY) ^ crc2


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``A + B`` from the CRC-32 of ``A`` and of ``B`` and ``len(B)``."""
    return _multmodp(_x8nmodp(len2, _CRC32_POLY), crc1, _CRC32_POLY) ^ crc2


# ---- hex digests as the manifest writes them -------------------------------------------------
_FILE_CHUNK = 8 * 2**20


def crc32c_bytes(data: bytes) -> str:
    """The CRC-32C of ``data`` as 8 lowercase hex digits (the manifest's spelling)."""
    return f"{crc32c_update(0, data):08x}"


def crc32c_file(path: str) -> str:
    """The CRC-32C of the file at ``path`` as 8 lowercase hex digits, read in 8 MiB chunks."""
    crc32c, _sha = file_sums(path)
    assert crc32c is not None
    return crc32c


def file_sums(
    path: str, *, crc32c: bool = True, sha256: bool = False
) -> tuple[str | None, str | None]:
    """``(crc32c, sha256)`` of the file at ``path`` in ONE read (hex; None for what was not
    asked): the manifest's checksum and the signature's digest cost one pass over the bytes.

    In a file of more than two chunks the SHA-256 of a chunk runs on a second thread while
    this one reads the next chunk and computes its CRC-32C (two buffers; hashlib releases the
    GIL), so on two free cores the pass costs about the larger of the two, not their sum
    (SHA-256 with SHA-NI: ~1.4 GB/s here; CRC-32C and a page-cache read: several GB/s)."""
    sha = hashlib.sha256() if sha256 else None
    with open(path, "rb", buffering=0) as f:
        if sha is not None and os.fstat(f.fileno()).st_size > 2 * _FILE_CHUNK:
            # A thread of its own per file, not a shared pool: a pool's thread does not
            # survive a fork, and a forked child would wait on it forever.
            with ThreadPoolExecutor(1, thread_name_prefix="ckptstore-sha256") as pool:
                crc = _read_overlapped(f, crc32c, sha, pool)
        else:
            crc = 0
            buf = bytearray(_FILE_CHUNK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                if crc32c:
                    crc = crc32c_update(crc, view[:n])
                if sha is not None:
                    sha.update(view[:n])
    return (f"{crc:08x}" if crc32c else None), (sha.hexdigest() if sha is not None else None)


def _read_overlapped(f: Any, crc32c: bool, sha: Any, pool: ThreadPoolExecutor) -> int:
    """Read ``f`` to its end in two alternating buffers: each chunk's SHA-256 update goes to
    ``pool`` (one worker: updates run in file order) while the next chunk is read and its
    CRC-32C computed here; returns the CRC-32C."""
    crc = 0
    buffers = [bytearray(_FILE_CHUNK), bytearray(_FILE_CHUNK)]
    pending: list[Future[None] | None] = [None, None]
    turn = 0
    while True:
        previous = pending[turn]
        if previous is not None:
            previous.result()  # its SHA-256 update is done: the buffer may be read into
        n = f.readinto(buffers[turn])
        if not n:
            break
        view = memoryview(buffers[turn])[:n]
        pending[turn] = pool.submit(sha.update, view)
        if crc32c:
            crc = crc32c_update(crc, view)
        turn ^= 1
    for future in pending:
        if future is not None:
            future.result()
    return crc
