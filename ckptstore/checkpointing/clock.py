"""The one clock the storage protocols compare durations on.

``time.monotonic`` stops while the machine is suspended (a laptop asleep, a paused VM), but
the storage's clock, GC's grace periods and delete windows keep running: a writer that measured
its own durations on it could believe minutes passed where hours did, and rely on blobs a sweep
deleted meanwhile. ``CLOCK_BOOTTIME`` (Linux) counts suspended time too.

Example::

    from ckptstore.checkpointing.clock import elapsed_clock
    started = elapsed_clock()
    ...
    took = elapsed_clock() - started      # includes time asleep
"""

from __future__ import annotations

import time


def elapsed_clock() -> float:
    """Seconds from an arbitrary origin, counting time the machine was suspended
    (``CLOCK_BOOTTIME``); ``time.monotonic`` where the OS has no such clock."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()
