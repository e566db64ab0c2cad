"""Determined 0.38.1 names that docs/determined-compat.md used to list as missing, used the way
Determined's code uses them: the local-mode searcher (``DummySearcherContext``), the searcher of a
config without ``max_length`` (``SearcherContextMissing``), trial metadata that outlives its
context, the Experiment calls the registry has no data for, ``trial_controller_class`` and the
callbacks' ``test_end_count``."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.registry import Registry


class FakeDistributed:
    """rank/size plus a broadcast that records what the chief sends and replays what a worker
    receives."""

    def __init__(self, rank: int, size: int, received: list[Any] | None = None) -> None:
        self.rank, self.size = rank, size
        self.sent: list[Any] = []
        self._received = list(received or [])

    def broadcast(self, obj: Any) -> Any:
        if self.rank == 0:
            self.sent.append(obj)
            return obj
        return self._received.pop(0)


# ---- DummySearcherContext / DummySearcherOperation ------------------------------------------------
def test_dummy_searcher_yields_one_operation_of_its_length(caplog):
    searcher = det.core.DummySearcherContext(det.core.DummyDistributedContext(), 5)
    assert isinstance(searcher, det.core.SearcherContext)
    assert searcher.get_configured_units() is det.core.Unit.EPOCHS
    ops = []
    # The logger's own level: an in-process CLI test before this one sets "ckptstore"'s.
    with caplog.at_level("INFO", logger="ckptstore"):
        for op in searcher.operations():
            assert isinstance(op, det.core.DummySearcherOperation)
            assert isinstance(op, det.core.SearcherOperation)
            op.report_progress(3)
            op.report_completed(0.25)
            ops.append(op.length)
    assert ops == [5]
    assert "progress report: 3/5" in caplog.text
    searcher.acknowledge_out_of_ops()  # accepted, as in Determined
    default = det.core.DummySearcherContext(FakeDistributed(0, 1))  # length 1 by default
    assert [op.length for op in _completed(default)] == [1]


def _completed(searcher: det.core.SearcherContext) -> list[det.core.SearcherOperation]:
    out = []
    for op in searcher.operations():
        op.report_completed(1.0)
        out.append(op)
    return out


def test_dummy_searcher_operation_checks_like_determineds():
    op = det.core.DummySearcherOperation(10, is_chief=True)
    assert op.length == 10
    op.report_completed(0.5)
    with pytest.raises(errors.InvalidConfig, match="twice"):
        op.report_completed(0.5)
    with pytest.raises(errors.InvalidConfig, match="after op.report_completed"):
        op.report_progress(4)
    op.report_progress(10)  # the final length is still accepted
    worker_op = det.core.DummySearcherOperation(10, is_chief=False)
    with pytest.raises(errors.InvalidConfig, match="chief"):
        worker_op.report_progress(1)
    with pytest.raises(errors.InvalidConfig, match="chief"):
        worker_op.report_completed(1.0)


def test_dummy_searcher_syncs_workers_with_the_chief():
    chief = FakeDistributed(0, 2)
    assert [op.length for op in _completed(det.core.DummySearcherContext(chief, 7))] == [7]
    assert chief.sent == [7, None]  # the length, then "no more operations"
    worker = det.core.DummySearcherContext(FakeDistributed(1, 2, received=[7, None]), 7)
    ops = list(worker.operations())
    assert [(type(op), op.length) for op in ops] == [(det.core.DummySearcherOperation, 7)]
    with pytest.raises(errors.InvalidConfig, match="chief"):
        ops[0].report_completed(1.0)
    with pytest.raises(errors.InvalidConfig, match="ChiefOnly"):
        list(
            det.core.DummySearcherContext(FakeDistributed(1, 2)).operations(
                det.core.SearcherMode.ChiefOnly
            )
        )


def test_dummy_searcher_requires_the_operation_to_be_completed():
    searcher = det.core.DummySearcherContext(det.core.DummyDistributedContext(), 3)
    with pytest.raises(errors.InvalidConfig, match="report_completed"):
        for _op in searcher.operations():
            pass


# ---- SearcherContextMissing -----------------------------------------------------------------------
def test_searcher_context_missing_refuses_every_call_with_a_value_error():
    missing = det.core.SearcherContextMissing()
    assert isinstance(missing, det.core.SearcherContext)
    # operations() raises when called, not when iterated (Determined's is not a generator)
    with pytest.raises(ValueError, match="max_length") as info:
        missing.operations()
    assert isinstance(info.value, errors.InvalidConfig)
    assert "training code" in str(info.value)
    with pytest.raises(errors.InvalidConfig, match="max_length"):
        missing.acknowledge_out_of_ops()
    with pytest.raises(errors.InvalidConfig, match="max_length"):
        missing.get_configured_units()


def test_trial_metadata_round_trips_across_a_new_context(where, tmp_path):
    with det.core.init(**where.core_kwargs()) as core_context:
        trial_id = core_context.info.trial.trial_id
        assert core_context.train.get_metadata() is None
        stored = core_context.train.set_metadata(
            {"stage": "warmup", "lr": np.float32(0.5), "bad": float("nan"), "tags": ["a", "b"]}
        )
        assert stored == {"stage": "warmup", "lr": 0.5, "bad": None, "tags": ["a", "b"]}
        assert core_context.train.get_metadata() == stored
    # a later context of the same trial (a resume) reads it back
    with det.core.init(trial_id=trial_id, **where.core_kwargs()) as core_context:
        assert core_context.train.get_metadata() == stored
        # set_metadata overwrites, as Determined's does
        assert core_context.train.set_metadata({"stage": "fine-tune"}) == {"stage": "fine-tune"}
    with det.core.init(trial_id=trial_id, **where.core_kwargs()) as core_context:
        assert core_context.train.get_metadata() == {"stage": "fine-tune"}
    # kept beside the trial's TensorBoard files and logs in the storage
    path = tmp_path / "ckpts" / "trial_metadata" / f"{trial_id}.json"
    assert json.loads(path.read_text()) == {"stage": "fine-tune"}
    # another trial has its own
    with det.core.init(**where.core_kwargs()) as other:
        assert other.info.trial.trial_id != trial_id
        assert other.train.get_metadata() is None


def test_trial_metadata_must_be_a_json_dict(where):
    with det.core.init(**where.core_kwargs()) as core_context:
        with pytest.raises(errors.InvalidConfig, match="dict"):
            core_context.train.set_metadata(["not", "a", "dict"])  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidConfig, match="JSON"):
            core_context.train.set_metadata({"f": object()})
        assert core_context.train.get_metadata() is None


def test_trial_metadata_needs_a_storage():
    train = det.core.TrainContext(None, trial_id=1)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidConfig, match="storage"):
        train.set_metadata({"a": 1})


# ---- Experiment.archive / unarchive / set_notes / delete ------------------------------------------
@pytest.fixture
def experiment(tmp_path):
    from ckptstore.experimental import client

    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    with Registry(registry_url) as registry:
        experiment_id = registry.create_experiment("exp", description="first")
    client.configure(registry=registry_url, storage=str(tmp_path / "ckpts"))
    yield client.get_experiment(experiment_id)
    client.configure()


@pytest.mark.parametrize(
    ("call", "instead"),
    [
        (lambda exp: exp.archive(), "add_label('archived')"),
        (lambda exp: exp.unarchive(), "remove_label('archived')"),
        (lambda exp: exp.set_notes("tuned lr"), "set_description(notes)"),
        (lambda exp: exp.delete(), "Checkpoint.delete()"),
    ],
)
def test_experiment_calls_without_registry_data_say_what_to_use(experiment, call, instead):
    with pytest.raises(errors.NotSupported, match="registry") as info:
        call(experiment)
    assert instead in str(info.value)
    experiment.reload()  # nothing changed
    assert experiment.description == "first" and experiment.archived is False


def test_experiment_refusals_keep_determineds_signatures(experiment):
    import inspect

    from ckptstore.experimental import ExperimentReference, client

    assert list(inspect.signature(client.Experiment.set_notes).parameters) == ["self", "notes"]
    assert ExperimentReference.archive is client.Experiment.archive
    with pytest.raises(TypeError):
        experiment.set_notes()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        experiment.archive("extra")  # type: ignore[call-arg]


def test_the_suggested_archive_label_works(experiment):
    experiment.add_label("archived")
    assert experiment.labels == ["archived"]
    experiment.remove_label("archived")
    assert experiment.labels == []


# ---- TFKerasTrial.trial_controller_class ----------------------------------------------------------
def test_trial_controller_class_is_ckptstores_controller():
    from ckptstore.keras_io.trial.controller import TrialController

    class MyTrial(det.keras.TFKerasTrial):
        def build_model(self):
            raise NotImplementedError

        def build_training_data_loader(self):
            raise NotImplementedError

        def build_validation_data_loader(self):
            raise NotImplementedError

    assert det.keras.TFKerasTrial.trial_controller_class is TrialController
    assert MyTrial.trial_controller_class is TrialController
    assert MyTrial(context=None).trial_controller_class is TrialController  # type: ignore[arg-type]

    class OwnController(TrialController):
        pass

    class Overridden(MyTrial):
        trial_controller_class = OwnController

    assert Overridden.trial_controller_class is OwnController


# ---- EarlyStopping / ReduceLROnPlateau.test_end_count ---------------------------------------------
@pytest.mark.parametrize("name", ["EarlyStopping", "ReduceLROnPlateau"])
def test_test_end_count_counts_validations_and_survives_a_resume(name):
    from ckptstore.keras_io.backend import keras

    cls = getattr(det.keras.callbacks, name)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    cb = cls(monitor="val_loss", patience=100)
    assert cb.test_end_count == 0
    model.fit(x, y, epochs=3, batch_size=16, validation_data=(x, y), callbacks=[cb], verbose=0)
    assert cb.test_end_count == 3  # one per validation pass
    model.evaluate(x, y, callbacks=[cb], verbose=0)
    assert cb.test_end_count == 4
    with warnings.catch_warnings():  # "val_loss is not available": there is no validation
        warnings.simplefilter("ignore", UserWarning)
        model.fit(x, y, epochs=2, batch_size=16, callbacks=[cb], verbose=0)
    assert cb.test_end_count == 4

    state = cb.get_state()
    assert state["test_end_count"] == 4
    assert "wait" in state and "best" in state  # Keras's own counters are still saved
    fresh = cls(monitor="val_loss", patience=100)
    fresh.load_state(state)
    assert fresh.test_end_count == 4 and fresh.best == cb.best
    older = cls(monitor="val_loss", patience=100)
    older.load_state({k: v for k, v in state.items() if k != "test_end_count"})
    assert older.test_end_count == 0  # a checkpoint from before the counter existed
