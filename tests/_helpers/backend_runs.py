"""A child pytest run of the Keras 3 tests on another backend (``KERAS_BACKEND=jax`` / ``torch``).

``KERAS_BACKEND`` must be set before Keras is first imported, and the suite's process has
imported it on TensorFlow already, so the selected tests run in a child pytest (a fresh
interpreter) with the variable set, started beside the session (tests/_helpers/child_runs.py).
tests/keras_io/test_jax_suite.py and test_torch_suite.py declare theirs with :func:`backend_run`
and check it with :func:`check_backend_run`.
"""

from __future__ import annotations

import sys

from tests._helpers.child_runs import ChildRun
from tests._helpers.jax_env import REPO, backend_missing, keras_env, require_backend


def backend_run(name: str, backend: str, node_ids: list[str], *, timeout: float) -> ChildRun:
    """The child run of ``node_ids`` on ``backend``; it starts only when the backend is there."""

    def command() -> tuple[list[str], str, dict[str, str]]:
        env = keras_env(backend, TF_CPP_MIN_LOG_LEVEL="2")
        argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *node_ids]
        return argv, REPO, env

    return ChildRun(name, command, timeout=timeout, ready=lambda: backend_missing(backend) is None)


def check_backend_run(run: ChildRun, backend: str, at_least: int) -> None:
    """Asserts the child run passed ``at_least`` tests, none skipped (skips if the backend's
    package is missing; with ``CI=true`` that skip fails)."""
    require_backend(backend)
    run.passed(at_least)
