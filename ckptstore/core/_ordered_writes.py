"""One thread that runs queued writes in the order they were queued (a trial's training metrics).

:class:`~ckptstore.core.TrainContext` queues each training-metrics registry write here and
returns, so a Keras epoch end no longer waits 5-40 ms (on loaded cores) for the database beside
the checkpoint snapshot (issue 42). What keeps the registry's contents and order as if each write
had been made at its call:

- one thread, first in first out;
- :meth:`OrderedWrites.wait` blocks until every queued write is done; the TrainContext waits
  before its other reports, and the registry runs it before each of its calls
  (:meth:`ckptstore.registry.Registry.add_barrier`), so a checkpoint's registration, a read
  of the metrics or the trial's final state comes after the metrics reported before it;
- a failed write keeps its exception (:meth:`OrderedWrites.take_failure`) for the caller to raise
  at its next call, and the writes queued behind it are dropped: the registry then holds a
  prefix of what was reported, as when the failing call had raised in the script.

The thread is started when a write is queued and ends when the queue is empty; it is not a
daemon thread, so a script that exits without closing its context still writes its metrics.

Example::

    writes = OrderedWrites("ckptstore-metrics")
    writes.submit(lambda: print("written"), "report metrics")
    writes.wait()
    failure = writes.take_failure()  # None: every write succeeded
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable

logger = logging.getLogger(__name__)


class OrderedWrites:
    """Queued callables run in order on one background thread (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        #: (write, what) pairs; the head stays queued while it runs, so wait() sees it.
        self._queue: deque[tuple[Callable[[], None], str]] = deque()
        self._running = False
        self._owner: int | None = None
        self._failure: BaseException | None = None
        _LIVE.add(self)

    def submit(self, write: Callable[[], None], what: str) -> None:
        """Queue ``write()`` behind the writes queued before it; returns at once."""
        with self._cond:
            self._queue.append((write, what))
            if self._running:
                return
            self._running = True
        thread = threading.Thread(target=self._drain, name=self._name)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down: no new threads, write here
            self._drain()

    def wait(self) -> None:
        """Block until every queued write is done (returns at once on the writing thread)."""
        with self._cond:
            if self._owner == threading.get_ident():
                return
            while self._running:
                self._cond.wait()

    @property
    def pending(self) -> bool:
        """Whether a write is queued or running."""
        return self._running

    def take_failure(self) -> BaseException | None:
        """The exception of a failed write not taken yet (then forgotten), else None."""
        with self._cond:
            failure, self._failure = self._failure, None
            return failure

    def _drain(self) -> None:
        with self._cond:
            self._owner = threading.get_ident()
        while True:
            with self._cond:
                if not self._queue:
                    self._running = False
                    self._owner = None
                    self._cond.notify_all()
                    return
                write, what = self._queue[0]
            try:
                write()
            except BaseException as exc:  # noqa: BLE001 - kept for the caller's next call
                with self._cond:
                    dropped = len(self._queue) - 1
                    self._queue.clear()
                    if self._failure is None:
                        self._failure = exc
                logger.error(
                    "Could not %s in the background (%s: %s)%s; the error is raised at the "
                    "trial's next metrics call or when its context closes.",
                    what,
                    type(exc).__name__,
                    exc,
                    f"; {dropped} later write(s) dropped to keep the order" if dropped else "",
                )
                continue
            with self._cond:
                self._queue.popleft()


_LIVE: weakref.WeakSet[OrderedWrites] = weakref.WeakSet()


def _forget_in_child() -> None:
    # A forked child has no writer thread (and the lock may have been held at the fork): the
    # queued writes are the parent's to make.
    for writes in list(_LIVE):
        writes._cond = threading.Condition()
        writes._queue.clear()
        writes._running = False
        writes._owner = None


os.register_at_fork(after_in_child=_forget_in_child)
