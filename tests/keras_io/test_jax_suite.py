"""The Keras 3 tests again on the JAX backend (``KERAS_BACKEND=jax``, issue 42), in a child pytest.

``KERAS_BACKEND`` must be set before Keras is first imported, and this pytest process has
imported it on TensorFlow already, so the tests run in a child pytest (a fresh interpreter) with
the variable set, like the Keras 2 child run (``tests/keras_io/test_keras2_suite.py``).

Kept small (the child's budget is ~4-5 minutes of CI): the plain-Keras tutorial's shape through
``DeterminedCallback`` (checkpoint contents and schedule, resume, warm start, a failed S3 upload,
stateful callbacks: ``test_callback.py``), the loaders (``load_checkpoint_model`` on local and S3
storage, ``test_loaders.py``'s latest/best/UUID case), checkpoints moving between JAX and
TensorFlow both ways (``test_backends.py``), and bit-equal SIGTERM/resume in fresh processes for
shuffled arrays, a ``keras.utils.PyDataset``, a ``tf.data.Dataset`` and a Python generator with
``steps_per_epoch`` (the PyDataset and tf.data cases add six worker processes, ~14 CPU-s each),
``ckptstore job run`` batch inference from a JAX checkpoint (``test_jobs.py``), and
``core.init`` + ``CheckpointContext`` alone with the loaders, the registry and the web UI over a
trial trained on JAX, and the in-process SavedModel of a model with a class of the training
script (``test_backend_coverage.py``), and scripts written for JAX in keras-io's shapes
(``test_backend_shapes.py``: a stateless ``train_step``, ``DataParallel`` and ``ModelParallel``
on two host CPU devices, augmentation layers, gradient accumulation, and keras-io's
backend-agnostic scripts: tf.data pipelines, TextVectorization, a PyDataset, a generator, a
layer/metric/loss of the script, Keras's stateful callbacks, a ``keras.ops`` layer built by
``fit()``, integer sequences from a generator, ``mixed_float16``, ``jit_compile=False``; SIGTERM,
bit-equal resume and load in two worker processes, ~115 CPU-s; and a VAE's sampling layer loaded
by UUID as ``keras.saving.load_model`` loads it).
"""

from __future__ import annotations

import pytest

from tests._helpers.backend_runs import backend_run, check_backend_run

EXACT = "tests/keras_io/test_exact_resume.py::"
CALLBACK = "tests/keras_io/test_callback.py::"
MODULES = [
    f"{CALLBACK}test_checkpoint_contents_and_schedule",
    f"{CALLBACK}test_warm_start_loads_weights_only_and_protects",
    f"{CALLBACK}test_failed_background_save_raises_from_fit",
    f"{CALLBACK}test_callback_state_applied_after_on_train_begin",
    f"{CALLBACK}test_snapshot_archive_matches_keras_layout_and_is_point_in_time",
    f"{CALLBACK}test_steps_completed_counts_a_short_last_execution_as_it_is",
    "tests/keras_io/test_loaders.py::test_latest_best_and_uuid",
    "tests/keras_io/test_backends.py::test_checkpoints_resume_and_load_across_backends",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[arrays_shuffle]",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[pydataset]",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[tfdata]",
    f"{EXACT}test_generator_with_steps_per_epoch_resumes_bit_exactly_on_jax",
    "tests/keras_io/test_backend_coverage.py",
    "tests/keras_io/test_backend_shapes.py",
    "tests/determined_compat/test_jobs.py::test_job_predicts_as_the_checkpoint[jax]",
]


#: Started with the session when JAX is there, beside the other tests
#: (tests/_helpers/child_runs.py); its limit counts from its start.
JAX_RUN = backend_run("JAX", "jax", MODULES, timeout=1500)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(4600)  # waits for the child runs queued before it, then its own
@JAX_RUN.test
def test_keras_tests_pass_on_jax():
    # test_loaders.py's case runs on local storage and S3
    check_backend_run(JAX_RUN, "jax", len(MODULES))
