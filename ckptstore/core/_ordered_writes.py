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

The thread is started at the first write and kept until :meth:`OrderedWrites.close`; it is a
daemon thread, and an exit handler waits for the queued writes, so a script that exits without
closing its context still writes its metrics.

Example::

    writes = OrderedWrites("ckptstore-metrics")
    writes.submit(lambda: print("written"), "report metrics")
    writes.close()
    failure = writes.take_failure()  # None: every write succeeded
"""

from __future__ import annotations

import atexit
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
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._writer: int | None = None  # the thread writing the queue
        _LIVE.add(self)

    def submit(self, write: Callable[[], None], what: str) -> None:
        """Queue ``write()`` behind the writes queued before it; returns at once."""
        with self._cond:
            self._queue.append((write, what))
            self._cond.notify_all()
            if self._thread is not None and not self._closed:
                return
            # One thread kept for the context's life: starting one per write waits for the OS
            # to schedule it, 5-15 ms on loaded cores (measured), the wait this class removes.
            self._closed = False
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # interpreter shutting down: no new threads, write here
            self._thread = None
            self._write_queued(stop_when_empty=True)

    def wait(self) -> None:
        """Block until every queued write is done (returns at once on the writing thread)."""
        with self._cond:
            if self._writer == threading.get_ident():
                return
            while self._queue:
                self._cond.wait()

    def close(self) -> None:
        """:meth:`wait`, then end the thread (a later :meth:`submit` starts another)."""
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def take_failure(self) -> BaseException | None:
        """The exception of a failed write not taken yet (then forgotten), else None."""
        with self._cond:
            failure, self._failure = self._failure, None
            return failure

    def _run(self) -> None:
        self._write_queued(stop_when_empty=False)

    def _write_queued(self, *, stop_when_empty: bool) -> None:
        self._writer = threading.get_ident()
        try:
            self._write_loop(stop_when_empty)
        finally:
            self._writer = None

    def _write_loop(self, stop_when_empty: bool) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed or stop_when_empty:
                        return
                    self._cond.wait()
                write, what = self._queue[0]
            try:
                write()
            except BaseException as exc:  # noqa: BLE001 - kept for the caller's next call
                with self._cond:
                    dropped = len(self._queue) - 1
                    self._queue.clear()
                    if self._failure is None:
                        self._failure = exc
                    self._cond.notify_all()
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
                self._cond.notify_all()


_LIVE: weakref.WeakSet[OrderedWrites] = weakref.WeakSet()


def _forget_in_child() -> None:
    # A forked child has no writer thread (and the lock may have been held at the fork): the
    # queued writes are the parent's to make.
    for writes in list(_LIVE):
        writes._cond = threading.Condition()
        writes._queue.clear()
        writes._thread = None


@atexit.register
def _write_everything_at_exit() -> None:
    # The thread is a daemon (an idle one must not keep the process alive); a script that
    # exits without closing its context still gets its queued metrics written.
    for writes in list(_LIVE):
        writes.wait()


os.register_at_fork(after_in_child=_forget_in_child)
