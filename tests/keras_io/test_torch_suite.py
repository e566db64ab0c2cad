"""The Keras 3 tests again on the PyTorch backend (``KERAS_BACKEND=torch``, issue 42), in a child
pytest like the JAX run (``tests/keras_io/test_jax_suite.py``; see tests/_helpers/backend_runs.py).

Kept smaller than the JAX run (its budget is ~5 minutes of CI, on the second core): the
plain-Keras tutorial's shape through ``DeterminedCallback`` (checkpoint contents and schedule,
with the SavedModel exported on TensorFlow; warm start, a failed S3 upload, stateful callbacks, as
on JAX), the loaders on local storage and S3 (``test_loaders.py``), the point-in-time snapshot (PyTorch's optimizer
writes into the parameters in place: a snapshot that held them would record the next steps; its
copy runs beside the next step, and writes in place right after a checkpoint leave it whole:
``test_torch_snapshot.py``), a
bit-equal SIGTERM/resume in fresh processes, validation data included, for shuffled NumPy
arrays, a ``keras.utils.PyDataset``, a ``tf.data.Dataset``, a Python generator with
``steps_per_epoch`` (fed through Keras's torch ``DataLoader``, whose iterators draw from torch's
global generator) and a user's ``torch.utils.data.DataLoader(shuffle=True)`` (its epoch's order
drawn from that generator), a checkpoint moving between PyTorch and TensorFlow both ways, optimizer state
included (``test_backends.py``), ``core.init`` + ``CheckpointContext`` alone with the loaders,
the registry and the web UI over a trial trained on torch, the SavedModel warning of a model
with a class of the training script (``test_backend_coverage.py``), and ``ckptstore job run``
batch inference from a torch checkpoint (``test_jobs.py``), and scripts written for PyTorch in
keras-io's shapes (``test_backend_shapes.py``: a ``train_step`` with ``zero_grad()``/
``backward()``, a GAN drawing from its own ``SeedGenerator``, augmentation layers, gradient
accumulation, keras-io's backend-agnostic scripts as on JAX; SIGTERM, bit-equal resume and load
in two worker processes, ~45 CPU-s; a VAE loaded by UUID).
"""

from __future__ import annotations

import pytest

from tests._helpers.backend_runs import backend_run, check_backend_run

EXACT = "tests/keras_io/test_exact_resume.py::"
CALLBACK = "tests/keras_io/test_callback.py::"
MODULES = [
    f"{CALLBACK}test_checkpoint_contents_and_schedule",
    f"{CALLBACK}test_snapshot_archive_matches_keras_layout_and_is_point_in_time",
    f"{CALLBACK}test_warm_start_loads_weights_only_and_protects",
    f"{CALLBACK}test_failed_background_save_raises_from_fit",
    f"{CALLBACK}test_callback_state_applied_after_on_train_begin",
    "tests/keras_io/test_torch_snapshot.py",
    "tests/keras_io/test_loaders.py::test_latest_best_and_uuid",
    "tests/keras_io/test_backends.py::test_checkpoints_resume_and_load_across_backends",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[arrays_shuffle]",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[pydataset]",
    f"{EXACT}test_sigterm_at_a_random_batch_resumes_bit_exactly[tfdata]",
    f"{EXACT}test_generator_with_steps_per_epoch_resumes_bit_exactly_on_torch",
    f"{EXACT}test_torch_dataloader_shuffled_resumes_bit_exactly_on_torch",
    "tests/keras_io/test_backend_coverage.py",
    "tests/keras_io/test_backend_shapes.py",
    "tests/determined_compat/test_jobs.py::test_job_predicts_as_the_checkpoint[torch]",
]

#: Started with the session when PyTorch is there (.venv-torch), after the JAX run.
TORCH_RUN = backend_run("PyTorch", "torch", MODULES, timeout=900)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(5500)  # waits for the child runs queued before it, then its own
@TORCH_RUN.test
def test_keras_tests_pass_on_torch():
    check_backend_run(TORCH_RUN, "torch", len(MODULES))
