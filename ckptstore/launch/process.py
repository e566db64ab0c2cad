"""The command line and environment of a process ckptstore starts for the user.

Two rules, applied to experiment trials, ``ckptstore job run`` workers and ``ckptstore run``:

- **The interpreter.** A command starting with a bare ``python`` or ``python3`` runs under the
  interpreter running ckptstore (``sys.executable``, i.e. its virtualenv, activated or not): a
  ``python3`` found on ``PATH`` is often another Python without TensorFlow or ckptstore. A path
  (``/usr/bin/python3``), another name (``python3.11``) or ``CKPTSTORE_PYTHON=/path/to/python``
  is used as given.
- **``import determined``.** :data:`ALIAS_DIR` goes first on the child's ``PYTHONPATH``; it holds
  a tiny ``determined`` package that makes ``determined``, ``determined.core``,
  ``determined.keras``, ``determined.experimental``, ``determined.launch.tensorflow``... the
  ckptstore modules of the same names, and logs one warning naming what is in use (and a real
  ``determined`` installed alongside, which that process then does not use). Nothing changes
  outside these processes: a real ``determined`` stays importable everywhere else.

Example::

    env = child_env(os.environ)
    subprocess.run(child_command(["python3", "train.py"]), env=env)
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

#: The folder holding the ``determined`` alias package (put first on a child's PYTHONPATH).
ALIAS_DIR = str(Path(__file__).resolve().parent / "alias")
#: Overrides the interpreter used for ``python``/``python3`` commands.
PYTHON_ENV = "CKPTSTORE_PYTHON"
#: Set in children that see the alias (the alias reads it to know who started the process).
ALIAS_ENV = "CKPTSTORE_DETERMINED_ALIAS"
_BARE_PYTHONS = ("python", "python3")


def interpreter(environ: Mapping[str, str] | None = None) -> str:
    """The Python that runs ``python``/``python3`` commands: ``CKPTSTORE_PYTHON`` or
    ``sys.executable``."""
    environ = os.environ if environ is None else environ
    return environ.get(PYTHON_ENV) or sys.executable


def child_command(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` with a leading bare ``python``/``python3`` replaced by :func:`interpreter`."""
    argv = list(argv)
    if argv and argv[0] in _BARE_PYTHONS:
        argv[0] = interpreter(environ)
    return argv


def child_env(
    environ: Mapping[str, str], *, extra_paths: Iterable[str] = (), who: str = "ckptstore"
) -> dict[str, str]:
    """A copy of ``environ`` for a user process: :data:`ALIAS_DIR`, then ``extra_paths``
    (the model folder), then the old ``PYTHONPATH``. ``who`` names the launcher in the alias's
    warning (``ckptstore experiment``, ``ckptstore run``...)."""
    env = dict(environ)
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != ALIAS_DIR]
    env["PYTHONPATH"] = os.pathsep.join([ALIAS_DIR, *extra_paths, *old])
    env[ALIAS_ENV] = who
    return env


class OutputTail:
    """Copies a child's output (a pipe) line by line to ``sink`` and keeps the last ``lines``.

    Example::

        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tail = OutputTail(proc.stdout, sys.stderr)
        proc.wait(); tail.join()
        print(tail.text())
    """

    def __init__(self, pipe: IO[bytes], sink: IO[str] | None = None, lines: int = 20) -> None:
        self._pipe = pipe
        self._sink = sink
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._all: list[str] = []
        self._thread = threading.Thread(target=self._copy, name="output-tail", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            line = raw.decode("utf-8", "replace")
            self._lines.append(line.rstrip("\n"))
            self._all.append(line)
            if self._sink is not None:
                try:
                    self._sink.write(line)
                    self._sink.flush()
                except (OSError, ValueError):  # the sink was closed: keep collecting
                    self._sink = None
        self._pipe.close()

    def join(self, timeout: float | None = 10.0) -> None:
        """Wait until the child's output is read to its end."""
        self._thread.join(timeout)

    def text(self) -> str:
        """The last lines, joined."""
        return "\n".join(self._lines)

    def full(self) -> str:
        """Everything read so far."""
        return "".join(self._all)


def spawn_output(pipe: IO[bytes] | None, lines: int = 20) -> OutputTail | None:
    """An :class:`OutputTail` copying ``pipe`` to this process's stderr (None for no pipe)."""
    return None if pipe is None else OutputTail(pipe, sys.stderr, lines)


__all__ = [
    "ALIAS_DIR",
    "ALIAS_ENV",
    "PYTHON_ENV",
    "OutputTail",
    "child_command",
    "child_env",
    "interpreter",
    "spawn_output",
]
