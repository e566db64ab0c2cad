"""Preemption: SIGTERM/SIGINT turn into a flag that all workers agree on.

Determined's master tells a trial to stop (pause, cluster maintenance) and the trial saves a
checkpoint and exits. Here the signal comes from the operating system: a scheduler's SIGTERM, or
Ctrl-C. The first signal only sets a flag; training code polls :meth:`PreemptContext.should_preempt`
at a safe point, saves, and stops. A second SIGINT falls back to the previous handler (usually
``KeyboardInterrupt``) so a stuck process can still be interrupted.

Example::

    with ckptstore.core.init() as core_context:
        for step in range(1000):
            train_one_step()
            if core_context.preempt.should_preempt():
                save()
                break
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any

from ckptstore import errors
from ckptstore.core._modes import PreemptMode, check_mode

logger = logging.getLogger(__name__)

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)


class PreemptContext:
    """Tracks whether this trial should stop, agreed across workers.

    Args:
        distributed: the trial's distributed context (anything with ``allgather`` and ``size``).
            With several workers, :meth:`should_preempt` is a collective call: every worker must
            call it at the same point (e.g. each batch or epoch end), and all get the same answer —
            True when any worker received a signal.
        signals: which signals request preemption; ``()`` installs no handlers. Handlers are
            installed only when created in the main thread, and the previous ones are restored by
            :meth:`close`.

    Example::

        preempt = PreemptContext(distributed)
        ...
        if preempt.should_preempt():
            save_and_exit()
        preempt.close()
    """

    def __init__(
        self,
        distributed: Any,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        preempt_mode: PreemptMode | str = PreemptMode.WorkersAskChief,
    ) -> None:
        self.mode = check_mode(PreemptMode, preempt_mode, "preempt_mode")
        self._distributed = distributed
        self._event = threading.Event()
        self._acknowledged = False
        self._signal_count = 0
        self._old_handlers: dict[int, Any] = {}
        self._install(tuple(signals))

    # ---- signal handling ----------------------------------------------------------------------
    def _install(self, signals: tuple[int, ...]) -> None:
        if not signals:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.info(
                "Preemption signal handlers not installed: core.init() ran outside the main "
                "thread. should_preempt() still works for flags set by request_preemption()."
            )
            return
        self._pid = os.getpid()
        for sig in signals:
            self._old_handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            self._in_forked_child(signum, frame)
            return
        self._signal_count += 1
        name = signal.Signals(signum).name
        if self._signal_count > 1 and signum == signal.SIGINT:
            old = self._old_handlers.get(signum)
            logger.warning("Second %s received; not waiting for a preemption checkpoint.", name)
            self.close()
            if callable(old):
                old(signum, frame)
                return
            raise KeyboardInterrupt
        logger.warning(
            "%s received: training will save a checkpoint and stop at the next safe point.", name
        )
        self._event.set()

    def _in_forked_child(self, signum: int, frame: FrameType | None) -> None:
        """A process forked from the training one (a ``multiprocessing`` pool's worker, e.g.
        Keras's ``PyDataset(use_multiprocessing=True)``) inherited the handler: the signal is
        its own (``Pool.terminate()`` sends SIGTERM), and it gets what it had before, so the
        pool's workers end instead of setting a flag nothing polls (the pool then waited on
        them forever)."""
        old = self._old_handlers.get(signum)
        signal.signal(signum, old if old is not None else signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old != signal.SIG_IGN:
            os.kill(os.getpid(), signum)

    def start(self) -> PreemptContext:
        """Determined starts its watcher thread here; signal handlers are already installed."""
        return self

    def request_preemption(self) -> None:
        """Ask this worker to stop, as a signal would (for tests and custom schedulers)."""
        self._event.set()

    # ---- Determined API -----------------------------------------------------------------------
    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True when any worker has been asked to stop.

        With several workers this is a collective call (see the class docstring). ``auto_ack``
        is accepted for Determined compatibility: signals need no acknowledgement to the
        operating system, so acknowledging only records that the request was seen.
        """
        local = self._event.is_set()
        size = getattr(self._distributed, "size", 1) if self._distributed is not None else 1
        if self.mode is PreemptMode.ChiefOnly:
            # Only the chief asks (Determined's rule), so no collective call is made.
            if getattr(self._distributed, "rank", 0) != 0:
                raise errors.InvalidConfig(
                    "should_preempt() was called on a worker with preempt_mode=ChiefOnly; call "
                    "it on the chief only, or use PreemptMode.WorkersAskChief. Received: rank="
                    f"{self._distributed.rank}."
                )
            size = 1
        if size > 1:
            decision = any(bool(x) for x in self._distributed.allgather(local))
        else:
            decision = local
        if decision and auto_ack:
            self.acknowledge_preemption_signal()
        return decision

    def acknowledge_preemption_signal(self) -> None:
        """Record that training saw the preemption request and is about to stop."""
        if not self._acknowledged:
            logger.info("Preemption acknowledged.")
        self._acknowledged = True

    @property
    def acknowledged(self) -> bool:
        """Whether :meth:`acknowledge_preemption_signal` was called."""
        return self._acknowledged

    def close(self) -> None:
        """Restore the signal handlers that were in place before (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, TypeError):  # pragma: no cover - exotic interpreters
                logger.debug("Could not restore handler for signal %s", sig)
        self._old_handlers.clear()

    def __repr__(self) -> str:
        return f"PreemptContext(requested={self._event.is_set()})"


__all__ = ["PreemptContext"]
