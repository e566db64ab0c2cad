"""Progress bars for transfers, on stderr and only when stderr is a terminal.

Storage backends call the progress callback from worker threads, so updates are locked.

Example::

    with transfer_progress("Downloading", total_bytes=10_000) as progress:
        storage.download(uuid, out_dir, progress=progress)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import IO

import click

from ckptstore.storage_backends.base import ProgressCallback


def wants_progress(stream: IO[str] | None = None) -> bool:
    """True when ``stream`` (default stderr) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def transfer_progress(
    label: str, total_bytes: int, *, force: bool | None = None
) -> Iterator[ProgressCallback | None]:
    """Yield a thread-safe byte counter drawing a bar, or None when no bar should be drawn."""
    show = wants_progress() if force is None else force
    if not show or total_bytes <= 0:
        yield None
        return
    lock = threading.Lock()
    with click.progressbar(
        length=total_bytes, label=label, file=sys.stderr, show_pos=False, show_percent=True
    ) as bar:

        def update(num_bytes: int) -> None:
            with lock:
                bar.update(num_bytes)

        yield update
