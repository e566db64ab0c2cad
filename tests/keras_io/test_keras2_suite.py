"""The Keras test modules again, with ``tf.keras`` = Keras 2 (``TF_USE_LEGACY_KERAS=1``, tf_keras).

``TF_USE_LEGACY_KERAS`` must be set before TensorFlow is first imported, and this pytest process
has imported Keras 3 already, so the modules run in a child pytest (a fresh interpreter) with the
variable set; CI, the storage emulators' settings and the rest of the environment pass through.
The child starts its own S3 emulator (the session fixtures), so the Keras 2 run covers local
storage and S3 like the Keras 3 one.

Which modules: those written against ``tests/keras_io/keras_under_test.py`` (the public API through
``tf.keras``). Of ``test_resume.py`` only the SIGKILL exact-resume case runs here: warm start,
preemption and clean stop are covered for Keras 2 by ``test_both_keras.py`` and
``test_keras2_iris.py``, which keeps the second run at about two minutes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = [
    "tests/keras_io/test_both_keras.py",
    "tests/keras_io/test_resume.py::test_four_epochs_equal_two_plus_sigkill_plus_two",
]


@pytest.mark.slow
def test_keras_modules_pass_under_keras2():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *MODULES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    tail = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 5, tail
    assert "skipped" not in summary and "xfail" not in summary, tail
