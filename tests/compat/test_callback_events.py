"""DeterminedCallback against what Determined's own callback tests look for: a core context whose
train/preempt parts only record calls (as their mock does) over a real checkpoint context and a
real DummyDistributedContext, and a subclass overriding ``save_model`` / ``load_model``.

Checked: ``train.set_status`` (training, validating, checkpointing, restoring, finishing),
``train.report_progress`` per epoch, reported metrics carrying ``epochs`` and ``batches`` and
no ``batch``/``size``, the batch report period, and that the overridden hooks are the ones that
save and restore the model (resume and warm start).
"""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import keras
import numpy as np
import pytest

import ckptstore as det
from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing import format as fmt

pytestmark = pytest.mark.e2e  # trains Keras models end to end

Events = list[tuple[str, Any]]


class RecordingCallback(det.keras.DeterminedCallback):
    """Logs the hooks Determined's tests watch; save_model/load_model add to the defaults."""

    def __init__(self, events: Events, *args: Any, **kwargs: Any) -> None:
        self.events = events
        super().__init__(*args, **kwargs)

    def on_train_begin(self, logs: Any = None) -> None:
        super().on_train_begin(logs)
        self.events.append((f"after_train_begin:{self.first_weight():.4f}", None))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.events.append((f"before_epoch_end:{epoch}", dict(logs or {})))
        super().on_epoch_end(epoch, logs)
        self.events.append((f"after_epoch_end:{epoch}", None))

    def on_train_end(self, logs: Any = None) -> None:
        self.events.append(("before_train_end", None))
        super().on_train_end(logs)

    def save_model(self, model: keras.Model, path: str, distributed: Any) -> None:
        super().save_model(model, path, distributed)
        self.events.append(("save_model", (path, self.first_weight())))

    def load_model(self, model: keras.Model, path: str, distributed: Any) -> None:
        super().load_model(model, path, distributed)
        self.events.append(("load_model", path))

    def first_weight(self) -> float:
        return float(self.model.layers[0].get_weights()[0][0][0])


def core_context(path: str, events: Events) -> Any:
    distributed = det.core.DummyDistributedContext()
    context = mock.Mock()
    context.distributed = distributed
    context.checkpoint = CheckpointContext(path, distributed=distributed)
    context.preempt.should_preempt.return_value = False
    context.train.report_metrics.side_effect = lambda group, steps, metrics: events.append(
        (f"report_metrics:{group}:{steps}", metrics)
    )
    context.train.report_progress.side_effect = lambda p: events.append(
        (f"report_progress:{p:.4f}", p)
    )
    context.train.set_status.side_effect = lambda s: events.append((f"set_status:{s}", None))
    return context


def fit(
    path: str,
    *,
    checkpoint: str | None = None,
    continue_id: int = 1,
    epochs: int = 2,
    period: int | str = "epoch",
) -> tuple[Events, RecordingCallback]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01))
    events: Events = []
    context = core_context(path, events)
    callback = RecordingCallback(
        events,
        context,
        checkpoint=checkpoint,
        continue_id=continue_id,
        train_metrics_report_period=period,
        export_saved_model="never",
    )
    x, y = np.ones((64, 8), "float32"), np.ones((64, 1), "float32")
    model.fit(
        x, y, validation_data=(x, y), batch_size=8, epochs=epochs, callbacks=[callback], verbose=0
    )
    context.checkpoint.close()
    return events, callback


def names(events: Events) -> list[str]:
    return [name for name, _ in events]


def assert_in_order(events: Events, *expected: str) -> None:
    """Each expected name occurs (as a prefix) after the previous one."""
    seen = names(events)
    at = 0
    for want in expected:
        for i in range(at, len(seen)):
            if seen[i].startswith(want):
                at = i + 1
                break
        else:
            pytest.fail(f"{want!r} not found after position {at} in {seen}")


def test_statuses_progress_and_metrics(tmp_path):
    """Determined's order: validation metrics reported at on_test_end (before on_epoch_end),
    training metrics, progress, then the save inside on_epoch_end (this callback is the last
    one: nothing after it changes the model), and no extra save at the end of training."""
    events, _ = fit(str(tmp_path))
    assert_in_order(
        events,
        "after_train_begin:0.0000",
        "set_status:training",
        "set_status:validating",
        "report_metrics:validation:8",
        "before_epoch_end:0",
        "report_metrics:training:8",
        "report_progress:0.5000",
        "set_status:checkpointing",
        "save_model",
        "after_epoch_end:0",
        "set_status:training",
        "report_metrics:validation:16",
        "before_epoch_end:1",
        "report_progress:1.0000",
        "set_status:checkpointing",
        "save_model",
        "after_epoch_end:1",
        "before_train_end",
        "set_status:finishing",
    )
    assert "load_model" not in names(events)
    assert names(events).count("save_model") == 2  # no extra save at the end of training
    reports = {name: data for name, data in events if name.startswith("report_metrics")}
    for name, metrics in reports.items():
        assert {"batches", "epochs"} <= set(metrics), (name, metrics)
        assert "batch" not in metrics and "size" not in metrics
    assert reports["report_metrics:training:16"]["epochs"] == 2
    assert reports["report_metrics:training:16"]["batches"] == 16
    assert not any(k.startswith("val_") for k in reports["report_metrics:training:8"])


def test_a_later_callback_defers_the_save(tmp_path):
    """A callback after this one with its own on_epoch_end (here one that changes the learning
    rate) may change what the checkpoint must hold: the save then waits for the next epoch begin
    (or train end), after Determined's point, and the checkpoint holds the changed rate."""
    events: Events = []
    context = core_context(str(tmp_path), events)

    class HalveRate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.model.optimizer.learning_rate.assign(self.model.optimizer.learning_rate / 2)
            events.append((f"halved:{epoch}", None))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.01))
    callback = RecordingCallback(
        events, context, checkpoint=None, continue_id=1, export_saved_model="never"
    )
    x = np.ones((16, 8), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, callbacks=[callback, HalveRate()], verbose=0)
    context.checkpoint.close()
    assert_in_order(events, "after_epoch_end:0", "halved:0", "save_model", "halved:1", "save_model")
    with CheckpointContext(str(tmp_path)).restore_path(callback.last_checkpoint) as path:
        restored = keras.models.load_model(os.path.join(path, "model.keras"))
    # 0.01 halved after epochs 0 and 1: the final checkpoint was taken after both changes
    assert float(restored.optimizer.learning_rate.numpy()) == pytest.approx(0.0025)


def test_batch_report_period(tmp_path):
    events, _ = fit(str(tmp_path), period=3)
    training = [n for n in names(events) if n.startswith("report_metrics:training")]
    assert training == [f"report_metrics:training:{s}" for s in (3, 6, 9, 12, 15)]
    metrics = dict(events)["report_metrics:training:3"]
    assert metrics["batches"] == 3 and metrics["epochs"] == 1


def test_overridden_hooks_save_and_restore_the_model(tmp_path):
    events, callback = fit(str(tmp_path))
    saved_path, weight = [data for name, data in events if name == "save_model"][-1]
    assert os.path.basename(saved_path) == "model_checkpoint"
    assert weight != 0.0
    uuid = callback.last_checkpoint
    files = fmt.read_manifest(CheckpointContext(str(tmp_path)).storage, uuid)["files"]
    assert "model_checkpoint.weights.h5" in files  # the subclass's files are in the checkpoint

    # Same continue_id: the subclass's load_model restores, and only the remaining epoch runs.
    events, _ = fit(str(tmp_path), checkpoint=uuid, continue_id=1, epochs=3)
    assert_in_order(events, "set_status:restoring", "load_model", f"after_train_begin:{weight:.4f}")
    assert [n for n in names(events) if n.startswith("before_epoch_end")] == ["before_epoch_end:2"]
    assert "report_metrics:training:24" in names(events)

    # Another continue_id: warm start from the weights, epochs from 0 and steps from 0.
    events, _ = fit(str(tmp_path), checkpoint=uuid, continue_id=2, epochs=1)
    assert_in_order(events, "load_model", f"after_train_begin:{weight:.4f}", "before_epoch_end:0")
    assert "report_metrics:training:8" in names(events)
