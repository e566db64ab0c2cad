"""Heavy end-to-end modules run in a child pytest beside the session's other tests (CI time).

Most of the suite keeps one of CI's two cores busy: a test waits for one training process at a
time. The Keras 2 and JAX child runs (``tests/keras_io/test_keras2_suite.py``,
``test_jax_suite.py``) and the documentation pages run on the other core, but in the quiet
2-core run of 2026-11-27 the two child runs took 845 s of the session's 3,072 s; after them the
second core had only what the session's own tests started. The modules listed here (a Ray
cluster, runners killed and resumed, launchers and jobs, crashes at random points, the
model-shape corpus, the Determined scripts) are independent of the rest and start their own
servers, so the whole suite (``pytest`` with this test selected) runs them in a child
pytest queued after those runs, and deselects them in the session (``takes_over`` in
``tests/_helpers/child_runs.py``): the same tests, on the second core. Run alone or selected
by ``-k`` without this test, they run in the session as usual.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests._helpers.child_runs import ChildRun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = (
    "tests/experiment/test_ray_engine.py",
    "tests/experiment/test_ray_settings.py",
    "tests/experiment/test_multi_runner.py",
    "tests/experiment/test_runner.py",
    "tests/determined_compat/test_launcher.py",
    "tests/determined_compat/test_asha.py",
    "tests/determined_compat/test_jobs.py",
    "tests/reliability/test_crashes.py",
    "tests/keras_io/test_shape_corpus.py",
    "tests/compat/test_scripts.py",
)


def _command() -> tuple[list[str], str, dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=REPO)
    argv = [
        *(sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"),
        *("--durations=15", *MODULES),
    ]
    return argv, REPO, env


#: Queued after the Keras 2 and JAX child runs; its limit counts from its start.
BESIDE_RUN = ChildRun("end-to-end beside", _command, timeout=3000, takes_over=MODULES)


@pytest.mark.slow
@pytest.mark.timeout(4600)  # waits for the child runs queued before it, then its own
@BESIDE_RUN.test
def test_heavy_end_to_end_modules_pass_beside_the_session():
    # every test the session handed over passed in the child, none skipped
    proc = BESIDE_RUN.passed(at_least=BESIDE_RUN.taken_over)
    print(proc.stdout[-4000:])  # the child's slowest tests and summary (pytest -rP shows it)
