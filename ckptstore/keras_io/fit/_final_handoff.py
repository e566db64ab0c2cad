"""The final checkpoint of a ``fit()`` whose commit nobody waits for, handed to the writer by a
thread of its own.

When the final checkpoint carries a SavedModel export, ``fit()`` returns before it commits (see
``DeterminedCallback``). It still had to wait for a place in the writer's queue: the writer keeps
one checkpoint being written and one waiting, and when checkpoints come faster than it stores
them (short epochs; JAX trains a small model about twice as fast as TensorFlow on CPU) the final
save waited for a whole earlier write. The snapshot is already taken (a point-in-time copy), so a
thread waits for the place instead and ``fit()`` returns.

:class:`FinalHandoff` stands in for the writer where ``fit()`` leaves it (the exports' finisher):
:meth:`~FinalHandoff.wait` waits for the hand-over, then for the writer, and raises a failure
of either; :meth:`~FinalHandoff.close` closes the writer once the hand-over is done.

Example::

    handoff = FinalHandoff(writer)   # at fit()'s start
    handoff.hand_over(job)           # at the final save: returns at once
    handoff.wait()                   # committed (or raises)
    handoff.close()
"""

from __future__ import annotations

import queue
import shutil
import threading
from typing import Any


class FinalHandoff:
    """A thread, started with ``fit()`` (starting one at the final save waited 5-20 ms for the OS
    to schedule it on loaded cores), that submits the job given to :meth:`hand_over` to
    ``writer``; see the module docstring."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="ckptstore-final-handoff", daemon=True
        )
        self._thread.start()

    def hand_over(self, job: Any) -> None:
        """Submit ``job`` to the writer from the thread; returns at once."""
        self._jobs.put(job)

    def stop(self) -> None:
        """End the thread (nothing handed over, or after :meth:`wait`)."""
        self._jobs.put(None)

    def _run(self) -> None:
        job = self._jobs.get()
        if job is None:
            return
        try:
            self._writer.submit(job)
        except BaseException as exc:  # noqa: BLE001 - raised by wait()
            self._error = exc
            if job.extra_dir:
                shutil.rmtree(job.extra_dir, ignore_errors=True)

    def wait(self) -> None:
        """Wait until the job handed over (and every earlier one) is committed; raise why it
        could not be."""
        self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
        self._writer.wait()

    def close(self) -> None:
        """Close the writer once the job handed over is in its queue."""
        self._thread.join()
        self._writer.close()


__all__ = ["FinalHandoff"]
