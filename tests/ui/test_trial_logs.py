"""Logs of trials the experiment runner started: kept in storage beside the checkpoints and
shown on the trial page; the runner's own stdout still gets every line. A failed trial's
message shows the end of its log with its last error line (``error_tail``), read from storage
when the trial failed in another run (``stored_tail``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from ckptstore.experiment import create_experiment
from ckptstore.experiment.trial_logs import (
    MAX_BYTES,
    TrialLog,
    error_tail,
    log_key,
    stored_tail,
)
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings

pytestmark = pytest.mark.e2e  # starts trial processes

TRAIN_PY = """
import sys
import ckptstore as det

info = det.get_trial_info()
print(f"hello from trial {info.trial.trial_id} with units={info.trial.hparams['units']}")
print("a warning on stderr", file=sys.stderr)
with det.core.init() as core_context:
    core_context.train.report_validation_metrics(1, {"val_loss": 1.0})
"""


def test_runner_keeps_trial_logs_and_the_ui_shows_them(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    storage, registry = str(tmp_path / "ckpts"), f"sqlite:///{tmp_path / 'reg.db'}"
    model_dir = tmp_path / "script"
    model_dir.mkdir()
    (model_dir / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    raw = {
        "description": "logs",
        "hyperparameters": {"units": {"type": "categorical", "vals": [3]}},
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": {"batches": 1}},
        "entrypoint": f"{sys.executable} train.py",
    }
    exp_id = create_experiment(raw, model_dir, storage=storage, registry=registry)
    assert "hello from trial" in capfd.readouterr().out  # still on the runner's stdout
    with Registry(registry) as reg:
        (trial,) = reg.list_trials(exp_id)
    files = open_storage(storage).list(f"logs/{trial.id}")
    assert len(files) == 1
    text = (tmp_path / "ckpts" / "logs" / str(trial.id) / next(iter(files))).read_text()
    assert f"hello from trial {trial.id} with units=3" in text
    assert "a warning on stderr" in text
    settings = UiSettings(registry_url=registry, storage_url=storage, allowed_hosts=("testserver",))
    with TestClient(create_app(settings)) as client:
        html = client.get(f"/trials/{trial.id}").text
    assert f"hello from trial {trial.id} with units=3" in html


def test_trial_log_is_written_while_running_and_keeps_the_tail(tmp_path, monkeypatch):
    import ckptstore.experiment.trial_logs as trial_logs

    monkeypatch.setattr(trial_logs, "FLUSH_SECONDS", 0.1)
    storage = open_storage(str(tmp_path))
    script = (
        "import sys, time\n"
        "sys.stdout.write('x' * 1000 + '\\n' * 0); print('first', flush=True); time.sleep(1.5)\n"
        f"sys.stdout.write('y' * {MAX_BYTES} + '\\n'); print('last', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    log = TrialLog(storage, 5, "runner:host/1")
    log.follow(proc.stdout)
    key = log_key(5, "runner:host/1")
    assert key == "logs/5/runner_host_1.log"
    import time

    deadline = time.monotonic() + 10
    while not (storage.exists(key) and b"first" in storage.read_bytes(key)):
        assert time.monotonic() < deadline, "the log was not written while the trial ran"
        time.sleep(0.05)
    assert proc.poll() is None
    proc.wait()
    log.close()
    data = storage.read_bytes(key)
    assert len(data) == MAX_BYTES and data.endswith(b"last\n")


#: Output lines that say nothing went wrong (no capital letters: no "Error:", no "ERROR").
QUIET = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .=[]", max_size=30)
FAILURE = st.one_of(
    st.builds(
        lambda name, why: f"{name}Error: {why}", st.sampled_from(["Value", "OS", "Key"]), QUIET
    ),
    st.builds(
        lambda why: (
            f"2026-01-01 trial[7] ERROR ckptstore.keras_io.trial.worker: NotSupported: {why}"
        ),
        QUIET,
    ),
    st.just("Traceback (most recent call last):"),
)


@settings(max_examples=200, deadline=None)
@given(before=st.lists(QUIET, max_size=30), error=FAILURE, after=st.lists(QUIET, max_size=40))
def test_a_failure_message_keeps_the_last_error_line_and_the_end(before, error, after):
    lines = [*before, error, *after]
    shown = error_tail(("\n".join(lines) + "\n").encode(), 20).split("\n")
    assert error in shown  # however much output followed it
    assert len(shown) <= 21  # 20 lines and a "..." where lines were left out
    if len(lines) <= 20:
        assert shown == lines
    else:
        kept = min(len(after), 20 - 5)
        assert shown[len(shown) - kept :] == lines[len(lines) - kept :]  # the end, as it was


def test_stored_tail_reads_the_newest_log_of_the_trial(tmp_path):
    storage = open_storage(str(tmp_path))
    storage.write_bytes("logs/3/runner-b-20260101T000000.log", b"old run\nValueError: old\n")
    storage.write_bytes("logs/3/runner-a-20260102T000000.log", b"new run\nOSError: disk full\n")
    storage.write_bytes("logs/4/runner-a-20260103T000000.log", b"another trial\n")
    assert stored_tail(storage, 3) == "new run\nOSError: disk full"
    assert stored_tail(storage, 9) == ""  # no log: the message says "(no output)"
