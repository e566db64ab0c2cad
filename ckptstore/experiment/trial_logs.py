"""The output of a trial process the runner started, kept in storage beside the checkpoints.

The runner starts each trial with its stdout and stderr on one pipe; :class:`TrialLog` copies
every line to the runner's own stdout (the terminal sees what it saw before) and to
``<storage>/logs/<trial id>/<runner>-<start>.log``, rewritten every few seconds while the trial
runs and once more when it ends, so ``ckptstore ui`` (on any machine that reads the storage)
shows it. A log keeps its last :data:`MAX_BYTES`; a storage failure is logged and retried at the
next flush, never stopping the trial.

Example::

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = TrialLog(storage, trial_id=7, name="host-1234")
    log.follow(proc.stdout)
    proc.wait()
    log.close()
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from ckptstore import defaults
from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: How often a running trial's log is written to storage (seconds).
FLUSH_SECONDS = 3.0
#: The newest bytes of a log that are kept (older output is cut from the front).
MAX_BYTES = 8 * 2**20


def log_key(trial_id: int, name: str) -> str:
    """``logs/<trial id>/<name>.log`` with ``name`` made a safe file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "trial"
    return f"{defaults.TRIAL_LOGS_PREFIX}/{int(trial_id)}/{safe}.log"


class TrialLog:
    """Tee a trial's output to this process's stdout and to a log object in storage."""

    def __init__(self, storage: Storage, trial_id: int, name: str) -> None:
        self.storage = storage
        self.key = log_key(trial_id, name)
        self._data = bytearray()
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._done = threading.Event()
        self._reader: threading.Thread | None = None
        self._writer = threading.Thread(
            target=self._flush_loop, name=f"log-{trial_id}", daemon=True
        )
        self._writer.start()

    def follow(self, stream: IO[bytes]) -> None:
        """Read ``stream`` (the trial's stdout pipe) on a thread until it closes."""
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        out = getattr(sys.stdout, "buffer", None)
        for line in iter(stream.readline, b""):
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    out = None  # our own stdout went away; keep the storage copy going
            with self._lock:
                self._data += line
                if len(self._data) > MAX_BYTES:
                    del self._data[: len(self._data) - MAX_BYTES]
            self._dirty.set()
        stream.close()

    def _flush_loop(self) -> None:
        while not self._done.is_set():
            self._done.wait(FLUSH_SECONDS)
            if self._dirty.is_set():
                self._flush()

    def _flush(self) -> None:
        self._dirty.clear()
        with self._lock:
            data = bytes(self._data)
        try:
            self.storage.write_bytes(self.key, data)
        except Exception as exc:  # noqa: BLE001 - a log must never stop the trial
            self._dirty.set()
            logger.warning("Could not write the trial log %s: %s", self.key, exc)

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the output so far."""
        with self._lock:
            data = bytes(self._data[-64 * 1024 :])
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def close(self, timeout: float = 30.0) -> None:
        """Wait for the pipe to close (the trial ended), write the log a last time."""
        if self._reader is not None:
            self._reader.join(timeout)
        self._done.set()
        self._writer.join(timeout)
        self._flush()


def runner_log_name(runner: str) -> str:
    """A log name unique per start of a trial: the runner's identity and the start time."""
    return f"{runner}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"


class TrialLogs:
    """The logs of the trials one runner has started (what the runner calls)."""

    def __init__(self, storage_spec: str | Mapping[str, Any], runner: str) -> None:
        self.storage_spec = storage_spec
        self.runner = runner
        self._storage: Storage | None = None
        self._open: dict[int, TrialLog] = {}

    def follow(self, trial_id: int, proc: subprocess.Popen) -> None:
        """Start copying ``proc``'s output (its stdout pipe) for ``trial_id``."""
        if proc.stdout is None:
            return
        self.close(trial_id)  # a restarted trial gets a new log
        if self._storage is None:
            from ckptstore.storage_backends import open_storage

            self._storage = open_storage(self.storage_spec)
        log = TrialLog(self._storage, trial_id, runner_log_name(self.runner))
        log.follow(proc.stdout)
        self._open[trial_id] = log

    def close(self, trial_id: int) -> str:
        """Finish the trial's log; returns its last lines (what a failure message shows)."""
        log = self._open.pop(trial_id, None)
        if log is None:
            return ""
        log.close()
        return log.tail()

    def close_all(self) -> None:
        for trial_id in list(self._open):
            self.close(trial_id)
        if self._storage is not None:
            self._storage.close()
            self._storage = None
