"""A blob GC in another process, for ``test_gc_protocol.py``: ``python -m
tests.reliability.gc_worker URL CLOCK_OFFSET_SECONDS``.

Every wall-clock reading of this process is off by the offset (a GC host whose clock is a day
ahead or behind). It sweeps, prints ``claimed`` once it has claimed a condemnation and read
the references its deletes go by, then hangs until the test kills it.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    url, offset = sys.argv[1], float(sys.argv[2])
    real = time.time
    time.time = lambda: real() + offset  # the protocol must not care

    from ckptstore.checkpointing import blob_gc, condemned
    from ckptstore.storage_backends import open_storage

    real_references = blob_gc._references

    def references_then_hang(storage):  # type: ignore[no-untyped-def]
        found = real_references(storage)
        if condemned.read_all(storage).claims:
            print("claimed", flush=True)
            time.sleep(3600)
        return found

    blob_gc._references = references_then_hang
    blob_gc.sweep(open_storage(url))


if __name__ == "__main__":
    main()
