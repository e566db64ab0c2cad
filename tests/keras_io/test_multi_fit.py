"""A script calling ``fit()`` several times with one DeterminedCallback, preempted (real SIGTERM)
in any of its ``fit()`` calls and run again, ends bit-equal to an uninterrupted run.

Shapes (tests/keras_io/multi_fit_worker.py, every run a fresh process): transfer learning then
fine-tuning (frozen base, unfreeze, recompile with a new optimizer, ``fit()`` again) and
``fit(epochs=1)`` in a loop. Like a real script the preempted run goes on to its next ``fit()``
calls, which must train nothing; the re-run passes the calls that had finished and resumes the
one that was cut, at its next batch. The same holds when each ``fit()`` call is given a new
``DeterminedCallback`` built the same way (``fresh``): its runs end bit-equal to the uninterrupted
run that reuses one callback.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.keras_io.test_exact_resume import assert_same_arrays, results
from tests.keras_io.test_exact_resume import worker as run_worker


def run(workdir, shape: str, tag: str, sigterm_at: int | None = None, fresh: bool = False) -> dict:
    args = ["--dir", str(workdir), "--shape", shape, "--tag", tag]
    if sigterm_at is not None:
        args += ["--sigterm-at-step", str(sigterm_at)]
    if fresh:
        args.append("--fresh-callbacks")
    return results(workdir, tag, run_worker(args, module="tests.keras_io.multi_fit_worker"))


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory):
    """The uninterrupted run of each shape, made once."""
    cache: dict[str, dict] = {}

    def get(shape: str) -> dict:
        if shape not in cache:
            cache[shape] = run(tmp_path_factory.mktemp(shape), shape, "straight")
        return cache[shape]

    return get


# (shape, step the SIGTERM follows, the fit() calls the preempted run trained in, a new
# DeterminedCallback per fit() call; 3 steps/epoch)
CASES = [
    ("finetune", 1, [[0], []], False),  # phase 1 (frozen base), inside its first epoch
    ("finetune", 7, [[0, 1], [2]], False),  # phase 2 (fine-tuning), inside its first epoch
    ("loop", 4, [[0], [0], []], False),  # inside the second fit(epochs=1) of the loop
    # the same scripts creating DeterminedCallback(ctx, ctx.info.latest_checkpoint, 1) per call
    ("finetune", 7, [[0, 1], [2]], True),
    ("loop", 4, [[0], [0], []], True),
]


@pytest.mark.parametrize(
    "shape, step, fits, fresh",
    CASES,
    ids=[f"{c[0]}-{c[1]}" + ("-fresh" if c[3] else "") for c in CASES],
)
def test_preempted_in_any_fit_call_resumes_bit_exactly(
    tmp_path, straight_runs, shape, step, fits, fresh
):
    straight = straight_runs(shape)  # one reused callback
    part = run(tmp_path / "cut", shape, "part", sigterm_at=step, fresh=fresh)
    assert part["preempted"] and part["fits"] == fits
    # the SIGTERM comes after DeterminedCallback's check of that step: it stops after the next
    assert part["steps_completed"] == step + 1
    rest = run(tmp_path / "cut", shape, "rest", fresh=fresh)
    assert not rest["preempted"]
    assert rest["steps_completed"] == straight["steps_completed"]
    assert rest["iterations"] == straight["iterations"]
    assert_same_arrays(straight, rest)
    # the calls that had finished train nothing the second time, and return their History
    assert rest["fits"] == straight["fits"]


def test_backup_and_restore_beside_it_is_named_at_fit_start(tmp_path, caplog):
    # both restore at fit() start (after a crash): one warning says so and which to remove
    import ckptstore as det
    from ckptstore.keras_io.backend import keras

    x = np.zeros((4, 2), "float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with det.core.init(
        storage=str(tmp_path / "ckpts"), registry=f"sqlite:///{tmp_path / 'r.db'}"
    ) as ctx:
        cb = det.keras.DeterminedCallback(
            ctx, checkpoint=None, continue_id=1, export_saved_model="never"
        )
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        with caplog.at_level(logging.WARNING, logger="ckptstore"):
            model.fit(x, x[:, :1], epochs=1, verbose=0, callbacks=[cb, backup])
    assert [r for r in caplog.records if "BackupAndRestore" in r.getMessage()]


def _fit_in(ctx, model, checkpoint):
    """One fit() of 2 epochs (4 batches each) with a new DeterminedCallback of run 1."""
    import ckptstore as det

    cb = det.keras.DeterminedCallback(ctx, checkpoint, 1, export_saved_model="never")
    x = np.random.RandomState(0).rand(32, 2).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    cb.wait()
    return cb


def test_a_new_callback_given_a_checkpoint_of_the_run_restores_it_into_another_model(
    tmp_path, caplog
):
    """Per-run counting keeps explicit restores: the newest checkpoint of the run goes into a
    new model object (read), and for the same model object it is what the model holds (not
    read again: the second call trains on, its steps counted on)."""
    import ckptstore as det
    from ckptstore.keras_io.backend import keras

    def model():
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(keras.optimizers.Adam(0.01), "mse")
        return m

    where = dict(storage=str(tmp_path / "ckpts"), registry=f"sqlite:///{tmp_path / 'r.db'}")
    with det.core.init(**where, trial_id=1, preempt_signals=False) as ctx:
        a = model()
        first = _fit_in(ctx, a, None)
        assert first.steps_completed == 8
        with caplog.at_level(logging.INFO, logger="ckptstore"):
            same = _fit_in(ctx, a, first.last_checkpoint)
        assert same.steps_completed == 16 and not same.resumed
        # its closing line says it went on with the run, not that it started fresh
        ends = [r.getMessage() for r in caplog.records if "fit() done" in r.getMessage()]
        assert ends and "fit() call 2, continuing the run" in ends[-1], ends
        b = model()
        # read: B continues at epoch 2, the end of its fit(epochs=2), so nothing more trains
        other = _fit_in(ctx, b, same.last_checkpoint)
        assert other.resumed and other.steps_completed == 16
        assert int(b.optimizer.iterations.numpy()) == 16
