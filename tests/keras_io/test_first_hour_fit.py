"""Issue 39 ("the first hour"), what DeterminedCallback says: one INFO line per committed
checkpoint (uuid, storage, size, new bytes) and per resume (epoch and batch), a summary when
fit() ends, shown on stderr unless verbose=0 (or the program configured logging itself); a
warning when fit() starts fresh in a trial that holds checkpoints; a two-line error, without
weight values, for a resume into a model of another shape."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from tests._helpers.fresh_home import fresh_home_env
from tests.keras_io.keras_under_test import tiny_model

pytestmark = pytest.mark.e2e  # trains Keras models end to end

X = np.linspace(-1, 1, 32, dtype="float32").reshape(8, 4)
Y = np.zeros((8, 2), dtype="float32")


def _fit(where, trial_id, model, epochs, checkpoint="latest", verbose=0):
    with det.core.init(trial_id=trial_id, **where.core_kwargs()) as ctx:
        start = ctx.info.latest_checkpoint if checkpoint == "latest" else checkpoint
        cb = det.keras.DeterminedCallback(ctx, start, trial_id, export_saved_model="never")
        model.fit(X, Y, batch_size=4, epochs=epochs, callbacks=[cb], verbose=verbose)
    return cb


def test_each_commit_and_resume_says_so(where, caplog):
    _fit(where, 1, tiny_model(), 1)
    caplog.clear()
    with caplog.at_level("INFO", logger="ckptstore"):
        cb = _fit(where, 1, tiny_model(), 2)
    text = caplog.text
    committed = re.findall(r"Checkpoint (\S+) committed to (\S+): \d+ files, ", text)
    assert [u for u, _ in committed] == [cb.last_checkpoint]
    assert committed[0][1].startswith("file://")
    assert re.search(r"[\d,]+ bytes, [\d,]+ bytes new", text)
    assert re.search(
        r"Resumed from checkpoint \S+ \(file://[^)]*\): epoch 1, steps_completed 2; "
        r"continuing at the start of epoch 2",
        text,
    )
    assert re.search(
        r"fit\(\) done for trial 1 \(resumed from \S+\): 1 checkpoint\(s\) saved", text
    )

    # a re-run of the finished trial says it has nothing left to train
    caplog.clear()
    with caplog.at_level("INFO", logger="ckptstore"):
        _fit(where, 1, tiny_model(), 2)
    assert re.search(
        r"epoch 2, steps_completed 4; fit\(epochs=2\) has no epoch left to train", caplog.text
    )

    # Finding 6: a unique UUID prefix of 8+ characters loads like the whole UUID.
    loaded = det.load_checkpoint_model(
        checkpoint_uuid=cb.last_checkpoint[:8], storage=where.storage, registry=where.registry
    )
    assert loaded.count_params() == tiny_model().count_params()


SCRIPT = """
import sys
import numpy as np
import keras
import ckptstore as det

x = np.zeros((8, 3), dtype="float32")
for trial_id, verbose in ((1, 0), (2, 2)):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with det.core.init(trial_id=trial_id, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, trial_id, export_saved_model="never")
        model.fit(x, x[:, :1], epochs=1, callbacks=[cb], verbose=verbose)
    print("END OF FIT", verbose, file=sys.stderr, flush=True)
"""


def test_the_lines_show_on_stderr_unless_verbose_0(tmp_path):
    """A program that did not configure logging sees them while fit() shows progress."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=fresh_home_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    quiet, shown = done.stderr.split("END OF FIT 0", 1)
    assert "ckptstore: Checkpoint" not in quiet
    assert "ckptstore: Checkpoint" in shown and "ckptstore: fit() done for trial 2" in shown


def _two_lines(error: BaseException) -> str:
    """The other-model error's text: two lines naming both models, no weight values."""
    text = str(error)
    assert len(text.splitlines()) == 2, text
    assert "Dense(6)" in text and "Sequential" in text, text
    assert not re.search(r"\d\.\d{4,}", text)  # no weight values
    return text


def test_a_resume_into_another_model_says_which_is_which_in_two_lines(where):
    """Keras 3 reads the model from model.keras; Keras 2 (the child run of
    test_keras2_suite.py) from model_config.json beside its TF checkpoint."""
    _fit(where, 3, tiny_model(hidden=6), 1)
    with pytest.raises(errors.ResumeError) as info:
        _fit(where, 3, tiny_model(hidden=0), 2)
    text = _two_lines(info.value)
    assert "trial 3" in text and "ckptstore trial delete 3 --yes" in text


def test_a_warm_start_into_another_model_names_both_trials(where):
    """A warm start (another trial's checkpoint, weights only) into another model says which
    trial holds which model and never suggests deleting the trial it came from."""
    source = _fit(where, 5, tiny_model(hidden=6), 1).last_checkpoint
    with pytest.raises(errors.ResumeError) as info:
        _fit(where, 6, tiny_model(hidden=0), 1, checkpoint=source)
    text = _two_lines(info.value)
    assert f"Checkpoint {source} of trial 5 holds" in text
    assert "this run is trial 6" in text and "trial delete" not in text


def test_starting_fresh_in_a_trial_with_checkpoints_warns(where, caplog):
    _fit(where, 4, tiny_model(), 1)
    with caplog.at_level("WARNING", logger="ckptstore"):
        _fit(where, 4, tiny_model(hidden=3), 1, checkpoint=None)
    assert "Trial 4 already holds checkpoints" in caplog.text
    assert "core.init() without trial_id" in caplog.text


PREEMPTED_SCRIPT = """
import os, signal, sys
import numpy as np
import keras
import tensorflow as tf
import ckptstore as det

# 200 batches of 2: more than the input pipeline reads ahead, so a preemption cuts it
x = np.linspace(-1, 1, 1200, dtype="float32").reshape(400, 3)


class Preempt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def fit(trial_id, data, callbacks=()):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with det.core.init(trial_id=trial_id) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, trial_id, export_saved_model="never")
        kwargs = {"batch_size": 2} if isinstance(data[0], np.ndarray) else {}
        model.fit(*data, epochs=2, callbacks=[cb, *callbacks], verbose=2, **kwargs)
    return cb  # kept to the exit, as a script's callback is


dataset = tf.data.Dataset.from_tensor_slices((x[:8], x[:8, :1])).batch(2)
kept = [fit(1, (dataset,)), fit(2, (dataset,)), fit(3, (x, x[:, :1]), [Preempt()])]
print("SCRIPT END", file=sys.stderr, flush=True)
"""


def test_a_preempted_fit_ends_quietly_and_each_line_shows_once(tmp_path):
    """The first hour, on TensorFlow: a fit() of arrays stopped by SIGTERM left the fit loop's
    tf.data iterator alive to the exit (TensorFlow's generator registry held it through
    ckptstore's pipeline), and TensorFlow logged "Error occurred when finalizing
    GeneratorDataset iterator" as the process ended; a fit() on a tf.data.Dataset printed each
    ckptstore line twice from its first checkpoint on (the iterator's TF checkpoint logs through
    absl, which gave the root logger a handler), and a later fit() none."""
    done = subprocess.run(
        [sys.executable, "-c", PREEMPTED_SCRIPT],
        env=fresh_home_env(tmp_path, TF_CPP_MIN_LOG_LEVEL="0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert "SIGTERM received" in err and "SCRIPT END" in err, err[-3000:]
    assert "GeneratorDataset iterator" not in err, err[-3000:]
    assert "INFO:ckptstore" not in err, err[-3000:]
    for trial in (1, 2, 3):
        assert err.count(f"ckptstore: fit() done for trial {trial} ") == 1, err[-3000:]
    committed = re.findall(r"ckptstore: Checkpoint (\S+) committed", err)
    assert committed and len(committed) == len(set(committed)), err[-3000:]


def test_a_line_clears_the_progress_bar_on_a_terminal(tmp_path):
    """With verbose=1 Keras draws its bar on the current line; a ckptstore line written then
    read ``loss: 0.8071ckptstore: Checkpoint ...``. On a terminal it now clears the bar first
    (Keras redraws it); in a file or pipe the line is written as it is."""
    import io
    import logging
    import os
    import pty

    from ckptstore.keras_io.fit import _fit_log

    def shown(stream, verbose_bar: bool) -> None:
        handler = _fit_log._LineHandler(stream, over_bar=verbose_bar)
        handler.setFormatter(logging.Formatter("ckptstore: %(message)s"))
        handler.emit(logging.makeLogRecord({"msg": "Checkpoint x committed"}))
        stream.flush()

    master, replica = pty.openpty()
    try:
        with os.fdopen(replica, "w") as terminal:
            shown(terminal, True)
            assert os.read(master, 1000).startswith(b"\r\x1b[Kckptstore: Checkpoint x committed")
            shown(terminal, False)  # verbose=2: one line per epoch, no bar to clear
            assert os.read(master, 1000).startswith(b"ckptstore: Checkpoint x committed")
    finally:
        os.close(master)
    piped = io.StringIO()
    shown(piped, True)
    assert piped.getvalue() == "ckptstore: Checkpoint x committed\n"
