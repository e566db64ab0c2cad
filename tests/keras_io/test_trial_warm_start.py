"""Determined's warm start through ``ckptstore experiment create`` (issue 28 item 7):
``searcher.source_checkpoint_uuid`` naming a checkpoint folder Determined's TFKerasTrial wrote into
the storage (no ``import-determined`` first), and ``source_trial_id`` naming a ckptstore trial.

The model trains one batch at learning rate 0, so its checkpoint holds exactly the weights it
started from, and Adam's iteration count tells whether the optimizer state came along. The
in-process cases also run on Keras 2 (``tests/keras_io/test_keras2_suite.py``)."""

import textwrap

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import ckptstore
from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.cli.main import cli
from ckptstore.experiment import describe_experiment
from ckptstore.registry import Registry
from tests.checkpointing._helpers import ec_key_pair
from tests.import_determined.determined_fixtures import make_values, write_tfkeras_trial_checkpoint

pytestmark = pytest.mark.e2e  # trains in trial processes started by the CLI

DET_UUID = "6f1c2a3b-0d4e-4f5a-8b6c-7d8e9f0a1b2c"
ITERATIONS = 100

MODEL_DEF = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf
    from ckptstore.keras import InMemorySequence, TFKerasTrial

    keras = tf.keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1

    class Trial(TFKerasTrial):
        def __init__(self, context):
            self.context = context

        def build_model(self):
            model = keras.Sequential(
                [keras.Input((3,)), keras.layers.Dense(4, name="dense"),
                 keras.layers.Dense(2, name="dense_1")]
            )
            model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.0), loss="mse")
            return model

        def _data(self):
            x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
            return InMemorySequence(data=x, labels=x[:, :2], batch_size=4)

        def build_training_data_loader(self):
            return self._data()

        def build_validation_data_loader(self):
            return self._data()
    """
)


def _create(where, tmp_path, searcher_extra):
    config = {
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "entrypoint": "model_def:Trial",
    }
    config["searcher"].update(searcher_extra)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["--storage", where.storage, "--registry", where.registry, "experiment", "create"]
    result = CliRunner().invoke(cli, [*args, str(path), str(tmp_path / "model")])
    assert result.exit_code == 0, result.output
    info = describe_experiment(int(result.output.strip().split()[-1]), registry=where.registry)
    assert info["state"] == "COMPLETED", info
    return info["trials"][0]


def _state(where, trial_id):
    """Weights and Adam's iteration count of the trial's checkpoint (read back as Keras does)."""
    with Registry(where.registry) as reg:
        uuid = reg.latest_checkpoint(trial_id).uuid
    model = ckptstore.load_checkpoint_model(
        checkpoint_uuid=uuid, storage=where.storage, registry=where.registry
    )
    return model.get_weights(), int(model.optimizer.iterations.numpy())


def test_source_checkpoint_uuid_of_a_determined_folder_then_source_trial_id(
    where, tmp_path, monkeypatch
):
    monkeypatch.setenv("CKPTSTORE_LOG_LEVEL", "WARNING")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model_def.py").write_text(MODEL_DEF)
    values = make_values(seed=3)
    # Determined's shared_fs layout: <host_path>/<uuid>/, the TFKerasTrial files, no MANIFEST.json
    marker = tmp_path / "unpickled"  # its rng_state.pkl creates this file when unpickled
    write_tfkeras_trial_checkpoint(
        f"{where.storage}/{DET_UUID}", values, iterations=ITERATIONS, marker=str(marker)
    )

    first = _create(where, tmp_path, {"source_checkpoint_uuid": DET_UUID})
    weights, iterations = _state(where, first["id"])
    for got, want in zip(weights, values["weights"], strict=True):
        np.testing.assert_array_equal(got, want)
    assert iterations == ITERATIONS + 1  # Determined's warm start keeps the optimizer state
    assert first["batches_trained"] == 1  # ...and starts the schedule afresh
    assert not marker.exists()  # Determined's pickles were not read

    # A ckptstore checkpoint warm-starts too (weights only, a fresh optimizer).
    second = _create(where, tmp_path, {"source_trial_id": first["id"]})
    weights, iterations = _state(where, second["id"])
    for got, want in zip(weights, values["weights"], strict=True):
        np.testing.assert_array_equal(got, want)
    assert iterations == 1


def _trial_class():
    import ckptstore.keras  # noqa: F401 - registers the Determined reader, as model_def.py does

    namespace: dict = {}
    exec(MODEL_DEF, namespace)  # the same trial class the CLI test imports from model_def.py
    return namespace["Trial"]


def _run_in_process(where, registry, trial_id, warm_start=None):
    from ckptstore.keras_io.trial.controller import TrialController

    config = {
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 1}},
        "entrypoint": "model_def:Trial",
    }
    with ckptstore.core.init(
        storage=where.storage,
        registry=registry,
        trial_id=trial_id,
        hparams={"global_batch_size": 4},
        preempt_signals=False,
    ) as core_context:
        controller = TrialController(_trial_class(), core_context, config, warm_start=warm_start)
        controller.run()
    return controller.model


def _assert_started_from(model, values, iterations):
    for got, want in zip(model.get_weights(), values["weights"], strict=True):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.iterations.numpy()) == iterations + 1


def test_trial_whose_latest_checkpoint_was_imported_from_determined(where, tmp_path):
    """After ``import-determined --trial N``, trial N continues from Determined's files."""
    from ckptstore.import_determined.layouts import import_determined

    values = make_values(seed=5)
    folder = write_tfkeras_trial_checkpoint(str(tmp_path / "det"), values, iterations=7)
    with Registry(where.registry) as registry:
        import_determined(folder, storage=where.storage, index=registry, trial_id=9)
        model = _run_in_process(where, registry, 9)
    _assert_started_from(model, values, 7)


def test_determined_folder_read_in_place_on_object_storage(
    where_local_and_s3, tmp_path, monkeypatch
):
    """The warm-start source is downloaded from the storage as is (local files or S3); a folder
    of that name that is not Determined's is refused, naming what it holds."""
    from ckptstore.storage_backends import open_storage

    where = where_local_and_s3
    values = make_values(seed=7)
    write_tfkeras_trial_checkpoint(str(tmp_path / "det"), values, iterations=3)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a checkpoint")
    other = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    with open_storage(where.storage) as storage:
        storage.upload(str(tmp_path / "det"), DET_UUID)
        storage.upload(str(tmp_path / "other"), other)
    with Registry(where.registry) as registry:
        _assert_started_from(_run_in_process(where, registry, 1, DET_UUID), values, 3)
        with pytest.raises(errors.ResumeError, match="notes.txt"):
            _run_in_process(where, registry, 2, other)
        # a verify key holds for a Determined folder too: an unsigned one is refused
        monkeypatch.setenv(signing.VERIFY_KEY_ENV, ec_key_pair(tmp_path)[1])
        with pytest.raises(errors.SignatureError, match="not signed"):
            _run_in_process(where, registry, 3, DET_UUID)
