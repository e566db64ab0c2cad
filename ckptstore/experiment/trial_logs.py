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
from typing import IO, TYPE_CHECKING

from ckptstore import defaults
from ckptstore.storage_backends.base import Storage

if TYPE_CHECKING:
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)

#: How often a running trial's log is written to storage (seconds).
FLUSH_SECONDS = 3.0
#: The newest bytes of a log that are kept (older output is cut from the front).
MAX_BYTES = 8 * 2**20


#: How many lines of a failed trial's output its failure message shows, and from how many of
#: its last bytes.
TAIL_LINES = 20
TAIL_BYTES = 64 * 1024
#: A line that says what went wrong: a traceback's start or its exception line, or an
#: exception logged at ERROR (the trial worker logs "... ERROR <logger>: <Type>: <message>").
#: The launcher's "A worker exited with 1" is a consequence, not the error, and does not match.
_ERROR_LINE = re.compile(
    r"^Traceback \(most recent call last\)"
    r"|^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)"
    r"|\b(ERROR|CRITICAL)\b [\w.]+: [A-Za-z_][\w.]*: "
)
#: Lines shown before an error line that fell out of the tail (the end of its traceback).
_CONTEXT = 5
#: The start time in a log's name (:func:`runner_log_name`): the newest log of a trial.
_STARTED = re.compile(r"-(\d{8}T\d{6})\.log$")


def error_tail(data: bytes, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``data``. When none of them says what went wrong but an
    earlier line does (one worker's exception, then the other workers' shutdown output or a
    library's exit noise), the last such line and the few before it come first, then ``...``
    and the last lines (``lines`` in all)."""
    text = data.decode("utf-8", "replace").splitlines()
    last = text[-lines:]
    if any(_ERROR_LINE.search(line) for line in last):
        return "\n".join(last)
    shown_from = len(text) - len(last)
    found = [i for i in range(shown_from) if _ERROR_LINE.search(text[i])]
    if not found:
        return "\n".join(last)
    end = found[-1] + 1
    head = text[max(0, end - _CONTEXT) : end]
    rest = text[max(end, len(text) - max(1, lines - len(head))) :]
    gap = ["..."] if end < len(text) - len(rest) else []
    return "\n".join(head + gap + rest)


def stored_tail(storage: Storage, trial_id: int, lines: int = TAIL_LINES) -> str:
    """:func:`error_tail` of the trial's newest log in storage; "" when it has none or the
    storage cannot be read (a failure message never fails on its log)."""
    prefix = f"{defaults.TRIAL_LOGS_PREFIX}/{int(trial_id)}"
    try:
        names = [rel for rel in storage.list(prefix) if rel.endswith(".log") and "/" not in rel]
        if not names:
            return ""
        newest = max(names, key=lambda n: ((m := _STARTED.search(n)) and m.group(1) or "", n))
        data = storage.read_bytes(f"{prefix}/{newest}")
    except Exception as exc:  # noqa: BLE001 - logged; the message says "(no output)"
        logger.warning("Could not read the logs of trial %s: %s", trial_id, exc)
        return ""
    return error_tail(data[-TAIL_BYTES:], lines)


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

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of the output so far, its error lines kept (see
        :func:`error_tail`)."""
        with self._lock:
            data = bytes(self._data[-TAIL_BYTES:])
        return error_tail(data, lines)

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

    def __init__(self, storage: StorageConfig, runner: str) -> None:
        self.storage_config = storage
        self.runner = runner
        self._storage: Storage | None = None
        self._open: dict[int, TrialLog] = {}

    def _opened(self) -> Storage:
        if self._storage is None:  # a storage of its own (closed by close_all), never the caller's
            config = self.storage_config
            self._storage = config.open_at(config.url)
        return self._storage

    def ready(self) -> bool:
        """Open the storage now; False (logged) when it cannot be opened."""
        try:
            self._opened()
        except Exception as exc:  # noqa: BLE001 - the trial runs without a stored log
            logger.warning("Could not open the storage of trial logs: %s", exc)
            return False
        return True

    def follow(self, trial_id: int, proc: subprocess.Popen) -> None:
        """Start copying ``proc``'s output (its stdout pipe) for ``trial_id``."""
        if proc.stdout is None:
            return
        self.close(trial_id)  # a restarted trial gets a new log
        log = TrialLog(self._opened(), trial_id, runner_log_name(self.runner))
        log.follow(proc.stdout)
        self._open[trial_id] = log

    def close(self, trial_id: int) -> str:
        """Finish the trial's log; returns its last lines (what a failure message shows)."""
        log = self._open.pop(trial_id, None)
        if log is None:
            return ""
        log.close()
        return log.tail()

    def stored_tail(self, trial_id: int) -> str:
        """The last lines of the trial's newest log in storage: a trial that failed in an
        earlier run, on another runner or on another engine (:func:`stored_tail`)."""
        try:
            storage = self._opened()
        except Exception as exc:  # noqa: BLE001 - the failure message goes on without it
            logger.warning("Could not open the storage of trial logs: %s", exc)
            return ""
        return stored_tail(storage, trial_id)

    def close_all(self) -> None:
        for trial_id in list(self._open):
            self.close(trial_id)
        if self._storage is not None:
            self._storage.close()
            self._storage = None
