"""Polling helper shared by the experiment tests that watch other processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.2) -> T | None:
    """The first truthy value ``predicate()`` returns within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None
