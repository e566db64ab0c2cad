"""The Keras test modules again, with ``tf.keras`` = Keras 2 (``TF_USE_LEGACY_KERAS=1``, tf_keras).

``TF_USE_LEGACY_KERAS`` must be set before TensorFlow is first imported, and this pytest process
has imported Keras 3 already, so the modules run in a child pytest (a fresh interpreter) with the
variable set; CI, the storage emulators' settings and the rest of the environment pass through.
The child starts its own S3 emulator (the session fixtures), so the Keras 2 run covers local
storage and S3 like the Keras 3 one.

Which modules: those written against ``tests/keras_io/keras_under_test.py`` (the public API through
``tf.keras``): ``test_both_keras.py``, ``test_trial_both_keras.py`` (a TFKerasTrial with a legacy
optimizer: train, checkpoint, resume exactly, and through the experiment runner),
``test_graph_mode_keras2.py`` (a module that disables eager execution, in graph mode),
``test_callback.py`` (checkpoint contents and schedule, metrics, resume errors, warm start, a
failed S3 upload, stateful callbacks), ``test_tensorboard.py``, ``test_keras_callback_state.py``,
``test_loaders.py`` (every loader path and error, and ``examples/batch_inference.py`` on local
storage and S3) and ``test_keras_context.py`` (the new Keras API). Tests marked ``keras3_only``
(``keras_under_test.keras3_only``, each with its reason) are deselected here. Of
``test_resume.py`` the SIGKILL exact-resume and the SIGTERM preemption cases run here; its clean
stop + warm start case (a minute of fresh processes) is covered for Keras 2 in one process by
``test_both_keras.py``. Of ``test_exact_resume.py`` (tiny data, a few fresh processes each) the
mid-epoch SIGTERM case runs for shuffled arrays, a ``keras.utils.Sequence`` and a tf.data
pipeline, plus the generator case (a warning at fit start, the cut epoch restarts). Keras 2 only
modules (``KERAS2_ONLY`` in ``tests/conftest.py``): ``test_export_keras2.py`` and
``test_tf_bundle_keras2.py``. Of ``test_trial_warm_start.py``, the in-process cases (a trial
starting from Determined's TFKerasTrial files, imported or read in place on local files and S3).
From ``tests/determined_compat/``: ``test_tf_keras_trial_port.py`` (Determined's own TFKerasTrial
tests, ported, on Keras 2 with legacy optimizers), ``test_trial_slots.py`` (a TFKerasTrial on
two workers under MultiWorkerMirroredStrategy: pause, resume on two and on one, same metrics),
``test_gan_trial.py`` (a GAN TFKerasTrial: images-only batches, two wrapped optimizers, a
subclassed model of sub-models; SIGTERM, exact resume, load) and ``test_trial_shapes.py`` (a
TFKerasTrial on a weighted Sequence with ``configure_fit()``; SIGTERM, exact resume). Of ``test_first_hour_fit.py``
(issue 39) the in-process cases: the INFO lines of a commit and a resume, the warning of a fresh
start in a trial with checkpoints, and the two-line error of a resume or warm start into a model
of another shape (its stderr case runs a Keras 3 script in a fresh process: Keras 3 only by
construction, not listed).
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests._helpers.child_runs import ChildRun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXACT = "tests/keras_io/test_exact_resume.py::"
RESUME = "tests/keras_io/test_resume.py::"
FIRST_HOUR = "tests/keras_io/test_first_hour_fit.py::"
MODULES = [
    "tests/keras_io/test_both_keras.py",
    "tests/keras_io/test_trial_both_keras.py",
    # a TFKerasTrial module that disables eager execution trains and resumes in graph mode
    "tests/keras_io/test_graph_mode_keras2.py",
    "tests/keras_io/test_callback.py",
    "tests/keras_io/test_tensorboard.py",
    "tests/keras_io/test_keras_callback_state.py",
    "tests/keras_io/test_loaders.py",
    "tests/keras_io/test_keras_context.py",
    f"{RESUME}test_four_epochs_equal_two_plus_sigkill_plus_two",
    f"{RESUME}test_sigterm_preemption_saves_stops_and_resumes",
    # mid-epoch SIGTERM resumes bit-exactly on Keras 2 too; a generator warns and restarts
    *(
        f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[{kind}]"
        for kind in ("arrays_shuffle", "pydataset", "tfdata")
    ),
    f"{EXACT}test_generator_warns_once_and_restarts_the_epoch",
    # SavedModel exports in a Keras 2 worker; export_checkpoint / the CLI on Keras 2 checkpoints
    "tests/keras_io/test_export_keras2.py",
    # deduplicated Keras 2 checkpoints cut model_checkpoint.data-* and the export at tensors
    "tests/keras_io/test_tf_bundle_keras2.py",
    # a TFKerasTrial starts from Determined's TFKerasTrial files (weights, optimizer h5)
    "tests/keras_io/test_trial_warm_start.py::"
    "test_trial_whose_latest_checkpoint_was_imported_from_determined",
    "tests/keras_io/test_trial_warm_start.py::test_determined_folder_read_in_place_on_object_storage",
    # issue 38: best-effort artifacts, load_checkpoint_model(model=), the model-shape corpus
    # (which checks the Keras 2 column of docs/reference/model-shapes.md)
    "tests/keras_io/test_fit_best_effort.py",
    "tests/keras_io/test_shape_corpus.py",
    # issue 39: what fit() says (INFO lines, fresh-start warning, another model's resume)
    *(
        f"{FIRST_HOUR}test_{name}"
        for name in (
            "each_commit_and_resume_says_so",
            "a_resume_into_another_model_says_which_is_which_in_two_lines",
            "a_warm_start_into_another_model_names_both_trials",
            "starting_fresh_in_a_trial_with_checkpoints_warns",
        )
    ),
    # Determined 0.38.1's test_tf_keras_trial.py, ported, with legacy optimizers
    "tests/determined_compat/test_tf_keras_trial_port.py",
    # a TFKerasTrial on two workers (Keras 2's train_on_batch would halve each worker's batch)
    "tests/determined_compat/test_trial_slots.py",
    # a GAN TFKerasTrial (Determined's DCGAN shape): weights-only subclassed model, 2 optimizers
    "tests/determined_compat/test_gan_trial.py",
    # a TFKerasTrial on a weighted Sequence with configure_fit(), preempted mid-epoch
    "tests/determined_compat/test_trial_shapes.py",
]


def _command() -> tuple[list[str], str, dict[str, str]]:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    argv = [
        *(sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"),
        *("-m", "not keras3_only"),  # Keras 3-only tests, each marked with its reason
        *MODULES,
    ]
    return argv, REPO, env


#: Started with the session, beside the other tests (tests/_helpers/child_runs.py); its limit
#: counts from its start and allows for sharing the machine with the rest of the suite.
KERAS2_RUN = ChildRun("Keras 2", _command, timeout=3000)


@pytest.mark.slow
@pytest.mark.timeout(4600)  # waits for the child runs queued before it, then its own
@KERAS2_RUN.test
def test_keras_modules_pass_under_keras2():
    proc = KERAS2_RUN.result()
    tail = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    # test_both_keras.py (8), test_trial_both_keras.py (7: TFKerasTrial),
    # test_graph_mode_keras2.py (1), test_callback.py (17),
    # test_tensorboard.py (2), test_keras_callback_state.py (3), test_loaders.py (12),
    # test_keras_context.py (5), test_resume.py (2), test_exact_resume.py (4),
    # test_export_keras2.py (7), test_tf_bundle_keras2.py (2), test_trial_warm_start.py (2),
    # test_tf_keras_trial_port.py (18), test_trial_slots.py (1), test_gan_trial.py (4),
    # test_export_keras2.py's adapted lookups (1), test_fit_best_effort.py (2),
    # test_shape_corpus.py (1), test_first_hour_fit.py (4), test_trial_shapes.py (1)
    assert passed and int(passed.group(1)) >= 104, tail
    assert "skipped" not in summary and "xfail" not in summary, tail
    # the keras3_only tests (README, "Keras 2 (tf_keras)"): test_callback.py's snapshot archive
    # layout, test_loaders.py's bare .keras files and test_fit_best_effort.py's layer saving a
    # generator; a new one updates this count and docs/concepts/keras2.md
    deselected = re.search(r"(\d+) deselected", summary)
    assert deselected and int(deselected.group(1)) == 3, tail
