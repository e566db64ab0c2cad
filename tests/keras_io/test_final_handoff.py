"""The final checkpoint of a fit() that does not wait for its commit is handed to the writer by
the handoff thread (issue 42): the training thread returns while the writer is still busy with
two earlier checkpoints, and the final one still commits, after them, with failures raised."""

from __future__ import annotations

import threading

import pytest

from ckptstore import errors
from ckptstore.core import init
from ckptstore.keras_io.fit._final_handoff import FinalHandoff
from ckptstore.keras_io.saving._writer import CheckpointWriter, SaveJob


class _HeldFiles:
    """A snapshot written by the writer thread (the Keras 2 ``write_into`` path) that waits
    for ``release`` first; ``"timed out"`` is recorded when the release never came."""

    def __init__(self, release: threading.Event, log: list[str], name: str) -> None:
        self.release, self.log, self.name = release, log, name

    def write_into(self, path: str) -> dict[str, str]:
        if not self.release.wait(timeout=30):
            self.log.append("timed out")
        self.log.append(self.name)
        return {}


def _job(release, log, name, steps):
    return SaveJob(snapshot=_HeldFiles(release, log, name), metadata={"steps_completed": steps})


@pytest.mark.timeout(120)
def test_the_final_checkpoint_is_handed_over_without_waiting_and_commits_last(tmp_path):
    release, log = threading.Event(), []
    with init(storage=str(tmp_path / "c"), registry=f"sqlite:///{tmp_path}/r.db") as ctx:
        writer = CheckpointWriter(ctx.checkpoint)
        handoff = FinalHandoff(writer)
        writer.submit(_job(release, log, "epoch 1", 1))  # being written (held)
        writer.submit(_job(release, log, "epoch 2", 2))  # waits in the queue: it is full
        handoff.hand_over(_job(release, log, "final", 3))  # returns: the thread waits instead
        assert log == []  # nothing written yet: the hand-over did not wait for the writer
        release.set()
        handoff.wait()
        handoff.close()
        assert log == ["epoch 1", "epoch 2", "final"]
        assert len(writer.saved) == 3
        metadata = ctx.checkpoint.get_metadata(writer.saved[-1])
        assert metadata["steps_completed"] == 3


def test_an_earlier_failure_is_raised_by_wait_and_the_final_job_dropped(tmp_path):
    log: list[str] = []

    class Failing(_HeldFiles):
        def write_into(self, path: str) -> dict[str, str]:
            raise OSError("disk full")

    release = threading.Event()
    release.set()
    with init(storage=str(tmp_path / "c"), registry=f"sqlite:///{tmp_path}/r.db") as ctx:
        writer = CheckpointWriter(ctx.checkpoint)
        handoff = FinalHandoff(writer)
        writer.submit(SaveJob(snapshot=Failing(release, log, "x"), metadata={"steps_completed": 1}))
        writer.submit(_job(release, log, "epoch 2", 2))
        handoff.hand_over(_job(release, log, "final", 3))
        with pytest.raises(errors.BackgroundUploadError, match="disk full"):
            handoff.wait()
        handoff.close()
        assert writer.saved == []
