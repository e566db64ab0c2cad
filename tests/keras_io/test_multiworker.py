"""Two worker processes under MultiWorkerMirroredStrategy (TF_CONFIG on loopback ports): only
the chief writes checkpoints, and both workers resume from the chief's checkpoint.

Plain ``model.fit()`` with ``DeterminedCallback`` in the list; the callback applies
``ckptstore.keras_io.fit._mwms_compat`` (Keras 3's multi-worker ``fit()`` fails without it). Every
write a worker makes to storage is journaled by a real ``LocalStorage`` subclass, so the test
sees which process wrote each file.

The worker half of this file runs as ``python -m tests.keras_io.test_multiworker RANK ...``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ckptstore.checkpointing.blobs import BLOBS_DIR
from ckptstore.launch.tensorflow import free_ports
from ckptstore.storage_backends.local import LocalStorage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER_TIMEOUT_S = 120
#: What a worker prints when the port it was given was taken before it could bind it.
_PORT_TAKEN = ("Could not start gRPC server", "Address already in use")


class JournalingStorage(LocalStorage):
    """``LocalStorage`` that appends every write it makes (object name, operation) to a journal
    file, so the test knows which worker wrote what. ``local_path`` is None, so checkpoints go
    through the journaled primitives instead of being written in place."""

    def __init__(self, url: str, journal: str) -> None:
        super().__init__(url)
        self._journal = journal

    def _note(self, op: str, name: str) -> None:
        with open(self._journal, "a") as f:
            f.write(json.dumps([op, name]) + "\n")

    def local_path(self, key: str) -> str | None:
        return None

    def rename_dir_into(self, local_dir: str, key: str) -> bool:
        return False

    def _upload_file(self, name: str, path: str, size: int) -> None:
        self._note("upload", name)
        super()._upload_file(name, path, size)

    def _write(self, name: str, data: bytes) -> None:
        self._note("write", name)
        super()._write(name, data)

    def _write_if_absent(self, name: str, data: bytes, sync: bool = True) -> bool:
        self._note("write_if_absent", name)
        return super()._write_if_absent(name, data, sync)

    def _copy_if_absent(self, name: str, path: str, offset: int, length: int, sync: bool) -> bool:
        self._note("write_if_absent", name)  # a chunk copied from a staged file
        return super()._copy_if_absent(name, path, offset, length, sync)

    def delete(self, key: str, globs=None) -> dict[str, int]:
        self._note("delete", key)
        return super().delete(key, globs)


def _journal(workdir, tag: str, rank: int) -> list[list[str]]:
    path = os.path.join(workdir, f"journal-{tag}-{rank}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def _run_workers(workdir, epochs: int, tag: str) -> tuple[list[int], list[str]]:
    """Start both workers on fresh ports; return their exit codes and output."""
    # The launcher's own picker: the chief's port + 1 (the channel) is free too, on every interface.
    chief, other = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{chief}", f"127.0.0.1:{other}"]}
    procs = []
    logs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            PYTHONPATH=REPO,
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}),
        )
        env.pop("CKPTSTORE_DIST_PORT", None)
        env.pop("CKPTSTORE_MWMS_COMPAT", None)
        log = open(os.path.join(workdir, f"{tag}-{rank}.log"), "w")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.keras_io.test_multiworker", str(workdir)]
                + [str(epochs), tag],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        # A worker that fails leaves the other one waiting in a collective: stop both then.
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in logs:
            log.close()
    outputs = []
    for rank in (0, 1):
        with open(os.path.join(workdir, f"{tag}-{rank}.log")) as f:
            outputs.append(f.read())
    return [p.returncode for p in procs], outputs


def run_pair(workdir, epochs: int, tag: str) -> list[dict]:
    """Run both workers to the end and return their result dicts.

    Free ports are picked, released and then bound by TensorFlow, so another process on the
    machine can take one in between; a start that fails that way (before any training or
    storage access) is retried on new ports.
    """
    for _attempt in range(3):
        codes, outputs = _run_workers(workdir, epochs, tag)
        if codes == [0, 0]:
            break
        if not any(marker in out for out in outputs for marker in _PORT_TAKEN):
            break
    if codes != [0, 0]:
        report = "\n".join(
            f"--- worker {rank} (exit {codes[rank]}):\n{outputs[rank][-4000:]}" for rank in (0, 1)
        )
        pytest.fail(f"run {tag!r} failed\n{report}")
    results = []
    for rank in (0, 1):
        with open(os.path.join(workdir, f"{tag}-{rank}.json")) as f:
            results.append(json.load(f))
    return results


@pytest.mark.slow
def test_two_workers_chief_writes_all_resume(tmp_path):
    first = run_pair(tmp_path, 2, "first")
    assert [r["rank"] for r in first] == [0, 1]
    assert [r["epochs_run"] for r in first] == [2, 2]
    assert first[0]["last_checkpoint"] and first[1]["last_checkpoint"] is None  # chief only
    # The workers trained on different shards of each batch and still agree: gradients are
    # all-reduced, and the reported loss is the same cross-worker mean on both.
    assert first[0]["weights"] == first[1]["weights"]
    assert first[0]["loss"] == first[1]["loss"]

    second = run_pair(tmp_path, 3, "second")
    for r in second:
        assert r["resumed"] is True
        # Both workers restored the chief's last checkpoint: its weights and optimizer step,
        # and training went on from epoch 2.
        assert r["restored_from"] == first[0]["last_checkpoint"]
        assert r["restored_weights"] == first[0]["weights"]
        assert r["restored_iterations"] == first[0]["iterations"]
        assert r["first_epoch"] == 2
        assert r["epochs_run"] == 1
        assert r["iterations"] == first[0]["iterations"] * 3 // 2
    assert second[0]["weights"] == second[1]["weights"]
    assert second[0]["weights"] != first[0]["weights"]

    from ckptstore.registry import Registry

    with Registry(f"sqlite:///{tmp_path / 'reg.db'}") as reg:
        rows = reg.list_checkpoints(trial_id=1)
    assert len(rows) == 3  # one per epoch, written by the chief only
    # checkpoint folders, beside .ckptstore-blobs/ (deduplicated by default)
    stored = sorted(p.name for p in (tmp_path / "ckpts").iterdir() if p.name != BLOBS_DIR)
    assert stored == sorted(row.uuid for row in rows)
    assert all((tmp_path / "ckpts" / name / "MANIFEST.json").exists() for name in stored)

    # Every file in storage was written by the chief; the other worker wrote nothing.
    for tag in ("first", "second"):
        assert _journal(tmp_path, tag, 1) == []
    chief_writes = _journal(tmp_path, "first", 0) + _journal(tmp_path, "second", 0)
    written = {name for op, name in chief_writes if op != "delete"}
    on_disk = {
        os.path.relpath(os.path.join(root, f), tmp_path / "ckpts").replace(os.sep, "/")
        for root, _, files in os.walk(tmp_path / "ckpts")
        for f in files
    }
    assert on_disk and on_disk <= written
    assert {name.split("/", 1)[0] for name in on_disk} == set(stored) | {BLOBS_DIR}


def _worker(workdir: str, epochs: int, tag: str) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    import ckptstore as det

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    rank = distributed.rank
    storage = JournalingStorage(
        os.path.join(workdir, "ckpts"), os.path.join(workdir, f"journal-{tag}-{rank}.jsonl")
    )
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = (x.sum(axis=1) * 1.5).astype("int64") % 3

    def weights(model):
        return [np.asarray(w).round(6).tolist() for w in model.get_weights()]

    class Recorder(keras.callbacks.Callback):
        """Runs after DeterminedCallback: sees the state fit() starts from."""

        def on_train_begin(self, logs=None):
            self.restored_weights = weights(self.model)
            self.restored_iterations = int(self.model.optimizer.iterations.numpy())
            self.first_epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.first_epoch is None:
                self.first_epoch = epoch

        def on_epoch_end(self, epoch, logs=None):
            self.epochs_here = getattr(self, "epochs_here", 0) + 1

    with det.core.init(
        storage=storage,
        registry=f"sqlite:///{os.path.join(workdir, 'reg.db')}",
        trial_id=1,
        distributed=distributed,
    ) as ctx:
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
            )
            model.compile(
                keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        restored_from = ctx.info.latest_checkpoint
        cb = det.keras.DeterminedCallback(
            ctx, restored_from, ctx.info.trial.trial_id, export_saved_model="never"
        )
        recorder = Recorder()
        # Global batch of 16: each worker trains on its own shard of 8 per step.
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=[cb, recorder])
        cb.wait()
        result = {
            "rank": rank,
            "resumed": cb.resumed,
            "restored_from": restored_from,
            "restored_weights": recorder.restored_weights,
            "restored_iterations": recorder.restored_iterations,
            "first_epoch": recorder.first_epoch,
            "epochs_run": getattr(recorder, "epochs_here", 0),  # History spans a resume
            "loss": history.history.get("loss"),
            "last_checkpoint": cb.last_checkpoint,
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights": weights(model),
        }
    with open(os.path.join(workdir, f"{tag}-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
