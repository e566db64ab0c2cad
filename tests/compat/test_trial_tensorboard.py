"""A TFKerasTrial whose ``keras_callbacks()`` returns Determined's
``det.keras.callbacks.TensorBoard(update_freq="batch", profile_batch=0, histogram_freq=1)`` (the
line from the issue) trains through the trial controller, and its event files land in
``<storage>/tensorboard/<trial id>/``, one TensorBoard epoch per workload as in Determined."""

from __future__ import annotations

import warnings

import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.keras_io.trial.controller import TrialController
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.keras_io.trial.test_controller import config
from tests.keras_io.trial.tiny_trial import TinyTrial

pytestmark = pytest.mark.e2e  # trains Keras models end to end


class BoardTrial(TinyTrial):
    board = None

    def keras_callbacks(self):
        board = det.keras.callbacks.TensorBoard(
            update_freq="batch", profile_batch=0, histogram_freq=1
        )
        BoardTrial.board = board
        return [*super().keras_callbacks(), board]


def test_trial_tensorboard_syncs_one_epoch_per_workload(tmp_path):
    storage = str(tmp_path / "ckpts")
    with Registry(f"sqlite:///{tmp_path / 'reg.db'}") as registry:
        with det.core.init(
            storage=storage,
            registry=registry,
            trial_id=4,
            hparams={"global_batch_size": 16, "data_type": "arrays"},
            preempt_signals=False,
        ) as core_context:
            result = TrialController(BoardTrial, core_context, config(max_batches=10, val=5)).run()
    assert result.batches_trained == 10
    workloads = TinyTrial.last_counter.workloads
    assert BoardTrial.board.workload_end_count == len(workloads) > 1
    assert BoardTrial.board.get_state() == {"workload_end_count": len(workloads)}
    with open_storage(storage) as store:
        files = sorted(store.list("tensorboard/4"))
    assert any(f.startswith("train/events.out.tfevents") for f in files), files
    assert any(f.startswith("validation/events.out.tfevents") for f in files), files


def test_deprecated_name_and_misuse():
    with pytest.warns(FutureWarning, match="det.keras.callbacks.TensorBoard"):
        board = det.keras.TFKerasTensorBoard(histogram_freq=1)
    assert isinstance(board, det.keras.callbacks.TensorBoard)
    with pytest.raises(errors.InvalidConfig, match="keyword arguments only"):
        det.keras.callbacks.TensorBoard("/tmp/logs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lonely = det.keras.callbacks.TensorBoard()
    with pytest.raises(errors.InvalidConfig, match=r"ckptstore.keras.TensorBoard\(core_context"):
        lonely.on_train_workload_end(3, {"loss": 1.0})


class StopTrial(TinyTrial):
    """Asks to stop through the context after 4 batches, reading env and the TensorBoard path."""

    seen: dict = {}

    def keras_callbacks(self):
        context = self.context
        StopTrial.seen = {
            "trial_id": context.env.det_trial_id,
            "seed": context.env.trial_seed,
            "tb": context.get_tensorboard_path(),
            "initial": context.get_initial_batch(),
        }

        class Stop(det.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if int(self.model.optimizer.iterations.numpy()) >= 4:
                    context.set_stop_requested(True)

            def on_checkpoint_end(self, checkpoint_dir):
                StopTrial.seen["checkpoint_dir"] = checkpoint_dir

        return [Stop()]


def test_set_stop_requested_ends_the_trial_after_the_batch(tmp_path):
    with Registry(f"sqlite:///{tmp_path / 'reg.db'}") as registry:
        with det.core.init(
            storage=str(tmp_path / "ckpts"),
            registry=registry,
            trial_id=6,
            hparams={"global_batch_size": 16, "data_type": "arrays"},
            preempt_signals=False,
        ) as core_context:
            controller = TrialController(
                StopTrial, core_context, config(max_batches=20, val=10), trial_seed=11
            )
            result = controller.run()
        assert result.status == "stopped_early" and result.batches_trained == 4
        assert registry.latest_checkpoint(6).steps_completed == 4
    assert StopTrial.seen["trial_id"] == "6" and StopTrial.seen["seed"] == 11
    assert StopTrial.seen["tb"].is_dir() and StopTrial.seen["initial"] == 0
    assert isinstance(StopTrial.seen["checkpoint_dir"], str)  # as Determined passed it
    with pytest.raises(errors.InvalidConfig, match="bool"):
        controller.context.set_stop_requested("yes")


def test_test_one_batch_trains_validates_and_checkpoints():
    from ckptstore import experimental

    config = {
        "hyperparameters": {
            "global_batch_size": 16,
            "data_type": {"type": "categorical", "vals": ["arrays"]},
        },
        "searcher": {"name": "adaptive_asha", "metric": "val_accuracy", "max_trials": 4,
                     "smaller_is_better": False, "max_length": {"batches": 100}},
    }  # fmt: skip
    result = experimental.test_one_batch(TinyTrial, config)
    assert result.batches_trained == 1
    assert "val_accuracy" in result.last_validation and result.latest_checkpoint
    with pytest.raises(errors.InvalidConfig, match="TFKerasTrial subclass"):
        experimental.test_one_batch(object, config)
