"""Determined's TensorFlow launcher: ``python3 -m determined.launch.tensorflow -- python3 train.py``.

Inside a process ckptstore starts, ``determined.launch.tensorflow`` is this module. It runs the
command after ``--`` (a leading ``python``/``python3`` becomes ckptstore's interpreter):

- ``resources.slots_per_trial`` 1 (the runner passes it as ``CKPTSTORE_SLOTS_PER_TRIAL``): the
  command replaces this process (same pid, so SIGTERM reaches the script directly).
- N > 1: N workers on this machine, each with a ``TF_CONFIG`` naming all N on free loopback ports
  (worker 0 is the chief), so ``det.core.DistributedContext.from_tf_config()`` builds a
  ``MultiWorkerMirroredStrategy``. SIGTERM/SIGINT are passed to every worker; when one worker
  fails the others are stopped; the exit status is the first non-zero one.

Determined's legacy ``... determined.launch.horovod --autohorovod --trial model_def:Trial``
entrypoint is read by the experiment config as the TFKerasTrial ``model_def:Trial`` (one
worker), so it never reaches this module.

Example::

    entrypoint: >-
      python3 -m determined.launch.tensorflow --
      python3 train.py
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from ckptstore import errors
from ckptstore.launch.process import child_command

logger = logging.getLogger(__name__)

#: Number of workers to start (the runner sets it from ``resources.slots_per_trial``).
SLOTS_ENV = "CKPTSTORE_SLOTS_PER_TRIAL"
_POLL_S = 0.2


def _parse(argv: Sequence[str]) -> list[str]:
    args = list(argv)
    if "--trial" in args[:3]:
        raise errors.InvalidConfig(
            "determined.launch.tensorflow --trial is handled by the experiment config: write "
            "`entrypoint: model_def:Trial`. Received: " + " ".join(args) + "."
        )
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise errors.InvalidConfig(
            "determined.launch.tensorflow needs the command to run. Received: nothing. Write "
            "`python3 -m determined.launch.tensorflow -- python3 train.py`."
        )
    return args


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports, each with the next port free too (the channel of
    ``DistributedContext`` listens on the chief's port + 1)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as a:
            a.bind(("", 0))  # TensorFlow's gRPC server binds every interface
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("", port + 1))
                except OSError:
                    continue
        if port not in ports and port + 1 not in ports and port - 1 not in ports:
            ports.append(port)
    return ports


def tf_configs(size: int) -> list[str]:
    """One ``TF_CONFIG`` JSON per worker of a ``size``-worker cluster on loopback."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(size)]}
    return [
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        for i in range(size)
    ]


def run_workers(command: Sequence[str], size: int, env: dict[str, str]) -> int:
    """Start ``size`` copies of ``command`` with their TF_CONFIG; returns the exit status."""
    procs = [
        subprocess.Popen(list(command), env={**env, "TF_CONFIG": config})
        for config in tf_configs(size)
    ]

    def forward(signum: int, frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            codes = [proc.poll() for proc in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                logger.error("A worker exited with %d; stopping the others", failed[0])
                for proc in procs:
                    if proc.poll() is None:
                        proc.terminate()
                for proc in procs:
                    proc.wait()
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(_POLL_S)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    command = child_command(_parse(sys.argv[1:] if argv is None else argv))
    raw = os.environ.get(SLOTS_ENV, "1").strip() or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise errors.InvalidConfig(f"{SLOTS_ENV} must be a positive integer. Received: {raw!r}.")
    size = int(raw)
    if size == 1:
        os.execvp(command[0], command)
    logger.info("Starting %d workers of %s", size, command)
    sys.exit(run_workers(command, size, dict(os.environ)))


if __name__ == "__main__":
    main()
