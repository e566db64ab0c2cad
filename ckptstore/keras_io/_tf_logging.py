"""TensorFlow calls that log through absl, made without changing the program's logging.

absl's logging functions call ``logging.basicConfig()`` when the root logger has no handler.
TensorFlow's checkpoint saver logs through absl, so ckptstore's own ``tf.train.Checkpoint`` of a
``tf.data`` iterator (at every checkpoint of a ``fit()`` on a ``tf.data.Dataset``) gave the root
logger a handler the program never asked for: from then on every INFO line of ckptstore was
printed twice (``ckptstore: ...`` and ``INFO:ckptstore...: ...``) and a later ``fit()`` showed
none of them. :func:`root_left_alone` keeps the root logger as the program left it.

Example::

    with root_left_alone():
        tf.train.Checkpoint(iterator=iterator).write(prefix)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["root_left_alone"]


@contextlib.contextmanager
def root_left_alone() -> Iterator[None]:
    """While in the block, a root logger without handlers has :data:`logging.lastResort`:
    absl sees a handler and leaves the root logger alone, and every record is shown as it would
    be with no handler (WARNING and above, on stderr)."""
    root = logging.getLogger()
    if root.handlers or logging.lastResort is None:
        yield
        return
    guard = logging.lastResort
    root.addHandler(guard)
    try:
        yield
    finally:
        root.removeHandler(guard)
