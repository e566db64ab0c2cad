"""The Keras test modules again, with ``tf.keras`` = Keras 2 (``TF_USE_LEGACY_KERAS=1``, tf_keras).

``TF_USE_LEGACY_KERAS`` must be set before TensorFlow is first imported, and this pytest process
has imported Keras 3 already, so the modules run in a child pytest (a fresh interpreter) with the
variable set; CI, the storage emulators' settings and the rest of the environment pass through.
The child starts its own S3 emulator (the session fixtures), so the Keras 2 run covers local
storage and S3 like the Keras 3 one.

Which modules: those written against ``tests/keras_io/keras_under_test.py`` (the public API through
``tf.keras``), among them ``test_trial_both_keras.py`` (a TFKerasTrial with a legacy optimizer:
train, checkpoint, resume exactly, and through the experiment runner). Of ``test_resume.py``
only the SIGKILL exact-resume case runs here: warm start, preemption and clean stop are covered
for Keras 2 by ``test_both_keras.py`` and ``test_keras2_iris.py``, which keeps the second run
at about two minutes. Of ``test_exact_resume.py`` (tiny data, a few fresh processes each) the
mid-epoch SIGTERM case runs for shuffled arrays, a ``keras.utils.Sequence`` and a tf.data
pipeline, plus the generator case (a warning at fit start, the cut epoch restarts).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXACT = "tests/keras_io/test_exact_resume.py::"
MODULES = [
    "tests/keras_io/test_both_keras.py",
    "tests/keras_io/test_trial_both_keras.py",
    "tests/keras_io/test_resume.py::test_four_epochs_equal_two_plus_sigkill_plus_two",
    # mid-epoch SIGTERM resumes bit-exactly on Keras 2 too; a generator warns and restarts
    *(
        f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[{kind}]"
        for kind in ("arrays_shuffle", "pydataset", "tfdata")
    ),
    f"{EXACT}test_generator_warns_once_and_restarts_the_epoch",
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
    # test_both_keras.py (8), test_trial_both_keras.py (7: TFKerasTrial), test_resume.py (1),
    # test_exact_resume.py (4)
    assert passed and int(passed.group(1)) >= 20, tail
    assert "skipped" not in summary and "xfail" not in summary, tail
