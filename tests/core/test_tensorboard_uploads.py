"""TensorBoard AUTO uploads run on their own background thread (issue 42): a metrics report does
not wait for the storage, every file reaches it (the files written after the last report at the
context's exit), and a failed upload surfaces once, as a StorageError naming the fix."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ckptstore import errors
from ckptstore.core import init


def _held_uploads(storage, release: threading.Event, threads: list[str]) -> threading.Event:
    """The context's real storage, whose uploads wait for ``release`` and record the thread
    they ran on (and ``"timed out"`` when a report waited for them: release never came).
    Returns an event set when the first upload has begun."""
    upload, started = storage.upload, threading.Event()

    def held(*args, **kwargs):
        threads.append(threading.current_thread().name)
        started.set()
        if not release.wait(timeout=30):
            threads.append("timed out")
        return upload(*args, **kwargs)

    storage.upload = held
    return started


@pytest.mark.timeout(240)
def test_auto_uploads_run_off_the_training_thread_and_none_is_lost(tmp_path):
    release, threads = threading.Event(), []
    with init(
        storage=str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path}/r.db",
        preempt_signals=False,
    ) as ctx:
        trial = ctx.trial_id
        started = _held_uploads(ctx.train._storage, release, threads)
        logs = ctx.train.get_tensorboard_path()
        (logs / "events.1").write_bytes(b"epoch 1")
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        ctx.train.report_validation_metrics(1, {"val_loss": 1.0})
        # both reports returned, and the first upload (begun on its own thread, however late
        # a loaded machine starts it) is held: it did not run on this thread
        assert started.wait(timeout=60)
        assert threading.current_thread().name not in threads
        (logs / "events.1").write_bytes(b"epoch 1, epoch 2")
        (logs / "events.2").write_bytes(b"written after the last report")
        release.set()
    assert threading.current_thread().name not in threads and "timed out" not in threads
    stored = ctx.storage.local_path(f"tensorboard/{trial}")
    assert Path(stored, "events.1").read_bytes() == b"epoch 1, epoch 2"
    assert Path(stored, "events.2").read_bytes() == b"written after the last report"


def test_a_failed_auto_upload_is_raised_once_naming_the_fix(tmp_path):
    root = tmp_path / "ckpts"
    with init(
        storage=str(root), registry=f"sqlite:///{tmp_path}/r.db", preempt_signals=False
    ) as ctx:
        trial = ctx.trial_id
        blocker = root / "tensorboard" / str(trial)
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"a file where the trial's folder goes: uploads fail")
        (ctx.train.get_tensorboard_path() / "events.1").write_bytes(b"e1")
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        with pytest.raises(errors.StorageError, match="tensorboard_mode='MANUAL'"):
            ctx.train.wait()  # waits for the upload, raises its failure
        ctx.train.report_training_metrics(2, {"loss": 0.5})  # raised once, not again
        assert ctx.registry.get_metrics(trial)[-1].steps_completed == 2
        with pytest.raises(errors.StorageError, match="reachable and writable"):
            ctx.train.wait()  # the upload after report 2 failed too
        blocker.unlink()
        ctx.train.report_training_metrics(4, {"loss": 0.1})
    assert Path(root, "tensorboard", str(trial), "events.1").read_bytes() == b"e1"


def test_the_final_upload_failing_raises_at_exit(tmp_path):
    root = tmp_path / "ckpts"
    with pytest.raises(errors.StorageError, match="tensorboard_mode='MANUAL'"):  # noqa: PT012
        with init(
            storage=str(root), registry=f"sqlite:///{tmp_path}/r.db", preempt_signals=False
        ) as ctx:
            (ctx.train.get_tensorboard_path() / "events.1").write_bytes(b"e1")
            blocker = root / "tensorboard" / str(ctx.trial_id)
            blocker.parent.mkdir(parents=True, exist_ok=True)
            blocker.write_bytes(b"uploads fail")
