"""Child pytest runs (the Keras 2 run, the JAX run) started as the session starts, beside it.

A child run is a fresh interpreter (``TF_USE_LEGACY_KERAS`` or ``KERAS_BACKEND`` must be set
before TensorFlow or Keras is first imported) that needs nothing of this session: it starts its
own emulators on free ports. Most of the suite keeps one core busy (one TensorFlow process at a
time), so this plugin (loaded by ``tests/conftest.py``) starts the selected child runs as soon as
collection ends, one after another in a background thread, and each child run's test only waits
for its result and checks it: the same tests run, on the second core. A child run whose test is
not selected does not start; one whose test runs first without the plugin's start starts then.

A test module declares its run with :class:`ChildRun` and decorates its test with it::

    KERAS2 = ChildRun("Keras 2", command, timeout=2400)

    @KERAS2.test
    def test_keras_modules_pass_under_keras2():
        proc = KERAS2.result()

A child run may also take tests over from the session (``takes_over``: node-id prefixes): when
its test is selected, those tests are deselected here and run in the child instead, beside the
session's own tests (tests/test_e2e_beside.py: heavy end-to-end modules that would otherwise
leave the second core idle). Tests of child runs (and :func:`waits_beside` tests) go last, so the others never wait.

The terminal summary says how long each child run took and how long its test waited for it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

#: The child runs of this session, in the order their tests were collected.
_QUEUE: list[ChildRun] = []
#: Set when the session ends: no child run starts after that.
_CLOSED = threading.Event()


class ChildRun:
    """One child pytest run: ``command()`` gives its argv, working folder and environment."""

    def __init__(
        self,
        name: str,
        command: Callable[[], tuple[list[str], str, dict[str, str]]],
        *,
        timeout: float,
        ready: Callable[[], bool] = lambda: True,
        takes_over: tuple[str, ...] = (),
    ) -> None:
        self.name, self.command, self.timeout, self.ready = name, command, timeout, ready
        self.takes_over = takes_over
        #: How many of the session's selected tests this run took over (``takes_over``).
        self.taken_over = 0
        self._command: tuple[list[str], str, dict[str, str]] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._files: tuple[Any, Any] | None = None
        self._started = threading.Event()
        self._lock = threading.Lock()
        self.queued = False
        self.start_time = self.end_time = self.waited = None

    def test(self, function: Callable[..., None]) -> Callable[..., None]:
        """Marks ``function`` as this run's test: the plugin starts the run when it is selected."""
        function._child_run = self  # type: ignore[attr-defined]
        return function

    def prepare(self) -> None:
        """Takes the command (and so the environment) now: a run the queue starts later must not
        get what a test running then has put in ``os.environ``."""
        if self._command is None:
            self._command = self.command()

    def start(self) -> None:
        with self._lock:
            if self._proc is not None:
                return
            if _CLOSED.is_set():
                raise RuntimeError(f"the session ended before the {self.name} child run started")
            self.prepare()
            assert self._command is not None
            argv, cwd, env = self._command
            self._files = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
            self.start_time = time.monotonic()
            # its own process group: stop() ends the child and the servers it started
            self._proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=self._files[0],
                stderr=self._files[1],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._started.set()

    def _wait(self) -> int | None:
        assert self._proc is not None
        left = self.timeout - (time.monotonic() - (self.start_time or 0.0))
        try:
            code = self._proc.wait(timeout=max(left, 0.0))
        except subprocess.TimeoutExpired:
            self.stop()
            return None
        if self.end_time is None:
            self.end_time = time.monotonic()
        return code

    def result(self) -> subprocess.CompletedProcess[str]:
        """The finished run (started now if the plugin did not): fails the test on its timeout."""
        began = time.monotonic()
        if not self.queued:
            self.start()
        self._started.wait()
        if self._proc is None:  # the background start failed: start here, raising its error
            self.start()
        code = self._wait()
        self.waited = time.monotonic() - began
        assert self._files is not None
        out, err = (self._read(f) for f in self._files)
        if code is None:
            pytest.fail(f"the {self.name} child run took over {self.timeout:.0f} s\n{out[-6000:]}")
        return subprocess.CompletedProcess(self._proc.args, code, out, err)  # type: ignore[union-attr]

    def passed(self, at_least: int) -> subprocess.CompletedProcess[str]:
        """:meth:`result`, checked: exit 0, ``at_least`` tests passed, none skipped or xfailed."""
        proc = self.result()
        tail = proc.stdout[-8000:] + proc.stderr[-3000:]
        assert proc.returncode == 0, tail
        summary = proc.stdout.strip().splitlines()[-1]
        passed = re.search(r"(\d+) passed", summary)
        assert passed and int(passed.group(1)) >= at_least, tail
        assert "skipped" not in summary and "xfail" not in summary, tail
        return proc

    @staticmethod
    def _read(file: Any) -> str:
        file.seek(0)
        return file.read().decode("utf-8", "replace")

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue


def _run_queue(runs: list[ChildRun]) -> None:
    for run in runs:
        try:
            run.start()
            run._wait()
        except Exception:  # noqa: BLE001 - the run's test starts it again and reports
            run.queued = False
            run._started.set()


def waits_beside(function: Callable[..., None]) -> Callable[..., None]:
    """Marks a test that only checks work started beside the session (the documentation pages'
    runs): like child runs' tests, it goes last, so it does not hold the session's tests up."""
    function._waits_beside = True  # type: ignore[attr-defined]
    return function


def _waits(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    return _run_of(item) is not None or getattr(function, "_waits_beside", False)


def _run_of(item: pytest.Item) -> ChildRun | None:
    run = getattr(getattr(item, "function", None), "_child_run", None)
    return run if isinstance(run, ChildRun) else None


@pytest.hookimpl(trylast=True)  # after -k / -m / --deselect: only a selected run takes tests over
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    runs = {run for run in map(_run_of, items) if run is not None and run.ready()}
    taken: list[pytest.Item] = []
    for run in runs:
        if run.takes_over and not run.taken_over:
            mine = [i for i in items if _run_of(i) is None and i.nodeid.startswith(run.takes_over)]
            run.taken_over = len(mine)
            taken += mine
    if taken:
        config.hook.pytest_deselected(items=taken)
    gone = set(taken)
    # the tests that wait for child runs go last, in their order: the others run meanwhile
    kept = [i for i in items if i not in gone]
    items[:] = [i for i in kept if not _waits(i)] + [i for i in kept if _waits(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        run = _run_of(item)
        if run is not None and run not in _QUEUE and run.ready():
            run.prepare()
            run.queued = True
            _QUEUE.append(run)
    if _QUEUE and not session.config.option.collectonly:
        threading.Thread(target=_run_queue, args=(list(_QUEUE),), daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _CLOSED.set()
    for run in _QUEUE:
        run.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for run in _QUEUE:
        if run.start_time is None:
            continue
        took = (run.end_time or time.monotonic()) - run.start_time
        waited = f"{run.waited:.0f} s" if run.waited is not None else "not reached"
        terminalreporter.write_line(
            f"child run {run.name}: {took:.0f} s in the background; its test waited {waited}"
        )
