"""``ckptstore.experimental.client`` used the way Determined's SDK docs use it: find checkpoints
of trials and experiments, download one, register model versions -- over a real registry and
storage (local files and the S3 emulator), written through the public Core API."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

import ckptstore as det
from ckptstore import errors
from ckptstore.experimental import client
from ckptstore.registry import Registry

SEARCHER = {"searcher": {"name": "single", "metric": "val_loss", "smaller_is_better": True}}


def write_trial(storage: str, registry: str, experiment_id: int, losses: list[float]) -> int:
    """A trial that saves one checkpoint per loss (with validation metrics), as a script would."""
    with det.core.init(
        storage=storage, registry=registry, experiment_id=experiment_id, preempt_signals=False
    ) as core_context:
        for step, loss in enumerate(losses, start=1):
            core_context.train.report_validation_metrics(step * 10, {"val_loss": loss})
            metadata = {"steps_completed": step * 10, "metrics": {"val_loss": loss}}
            with core_context.checkpoint.store_path(metadata) as (path, _uuid):
                (path / "weights.bin").write_bytes(bytes([step]) * 100)
                (path / "sub").mkdir()
                (path / "sub" / "note.txt").write_text(f"loss {loss}")
        return core_context.info.trial.trial_id


@pytest.fixture
def written(local_and_s3_url: str, tmp_path) -> Iterator[dict]:
    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    with Registry(registry_url) as registry:
        experiment_id = registry.create_experiment("exp", config=SEARCHER)
    trial_a = write_trial(local_and_s3_url, registry_url, experiment_id, [0.9, 0.4, 0.6])
    trial_b = write_trial(local_and_s3_url, registry_url, experiment_id, [0.8, 0.3])
    client.configure(registry=registry_url, storage=local_and_s3_url)
    yield {
        "experiment_id": experiment_id,
        "trials": (trial_a, trial_b),
        "tmp": tmp_path,
        "registry": registry_url,
        "storage": local_and_s3_url,
    }
    client.configure()


def test_checkpoint_download_is_determineds_batch_inference_recipe(written):
    exp = client.get_experiment(written["experiment_id"])
    best = exp.top_checkpoint()  # by the config's searcher metric, smaller is better
    # Determined's shape (v1Metrics.to_json()): averages under avgMetrics.
    assert best.training.validation_metrics == {
        "avgMetrics": {"val_loss": 0.3},
        "batchMetrics": None,
    }
    assert best.state is client.CheckpointState.COMPLETED
    assert best.training.trial_id == written["trials"][1]
    path = client.get_checkpoint(best.uuid).download(str(written["tmp"] / "dl"))
    assert open(os.path.join(path, "sub", "note.txt")).read() == "loss 0.3"
    assert json.load(open(os.path.join(path, "metadata.json")))["steps_completed"] == 20
    assert best.resources["weights.bin"] == 100


def test_default_download_folder_and_master_mode(written, monkeypatch):
    monkeypatch.chdir(written["tmp"])
    ckpt = client.get_trial(written["trials"][0]).select_checkpoint(latest=True)
    path = ckpt.download()
    assert path == os.path.join("checkpoints", ckpt.uuid)
    assert (written["tmp"] / path / "weights.bin").read_bytes() == bytes([3]) * 100
    with pytest.raises(errors.NotSupported, match="DownloadMode.DIRECT"):
        ckpt.download("x", client.DownloadMode.MASTER)


def test_trial_selection_and_ordering(written):
    trial = client.get_trial(written["trials"][0])
    assert trial.experiment_id == written["experiment_id"]
    best = trial.select_checkpoint(best=True)
    assert best.metadata["metrics"]["val_loss"] == 0.4
    worst = trial.top_checkpoint(sort_by="val_loss", smaller_is_better=False)
    assert worst.metadata["metrics"]["val_loss"] == 0.9
    by_batch = trial.list_checkpoints(
        sort_by=client.CheckpointSortBy.BATCH_NUMBER, order_by=client.OrderBy.DESCENDING
    )
    assert [c.metadata["steps_completed"] for c in by_batch] == [30, 20, 10]
    with pytest.raises(errors.InvalidConfig, match="exactly one"):
        trial.select_checkpoint(latest=True, best=True)
    reports = list(client.iter_trials_metrics([trial.id], "validation"))
    assert [m.metrics["val_loss"] for m in reports] == [0.9, 0.4, 0.6]
    assert isinstance(reports[0], client.ValidationMetrics)


def test_experiment_top_n_and_trials(written):
    exp = client.get_experiment(written["experiment_id"])
    assert [t.id for t in exp.list_trials()] == sorted(written["trials"])
    top = exp.top_n_checkpoints(3)
    assert [c.training.validation_metrics["avgMetrics"]["val_loss"] for c in top] == [0.3, 0.4, 0.6]
    with Registry(written["registry"]) as registry:
        registry.set_experiment_state(exp.id, "COMPLETED")
    assert exp.wait(interval=0.01) is client.ExperimentState.COMPLETED


def test_determined_sdk_object_is_the_client_over_its_own_registry(written, tmp_path):
    from ckptstore.experimental import Determined

    # Determined's older entry point: master/user are accepted and ignored.
    d = Determined("http://master:8080", "determined")
    best = d.get_experiment(written["experiment_id"]).top_checkpoint()
    assert best.uuid == client.get_experiment(written["experiment_id"]).top_checkpoint().uuid
    assert d.get_checkpoint(best.uuid).training.trial_id == written["trials"][1]
    assert [
        m.metrics["val_loss"] for m in d.iter_trials_metrics([written["trials"][1]], "validation")
    ] == [0.8, 0.3]
    d.create_model("digits", "d", None, ["prod"])
    assert [m.name for m in d.list_models()] == ["digits"] and d.get_model_labels() == ["prod"]
    with pytest.raises(errors.NotSupported, match="experiment create"):
        d.create_experiment({}, ".")
    # Its own registry (ckptstore's keyword), not the process-wide one.
    other = Determined(registry=f"sqlite:///{tmp_path / 'other.db'}", storage=written["storage"])
    assert other.list_experiments() == [] and other.list_models() == []
    with pytest.raises(errors.CheckpointNotFound):
        other.get_checkpoint(best.uuid)


def test_model_registry_round_trip(written):
    best = client.get_experiment(written["experiment_id"]).top_checkpoint()
    model = client.create_model("mnist", description="digits", metadata={"team": "a"})
    version = model.register_version(best.uuid)
    assert version.model_version == 1
    version.set_name("production")
    again = client.get_model("mnist").get_version("production")
    assert again.checkpoint.uuid == best.uuid
    assert client.get_model("mnist").get_version().model_version == 1
    model.set_labels(["cv", "prod"])
    assert client.get_model_labels() == ["cv", "prod"]
    assert [m.name for m in client.list_models(name="mni")] == ["mnist"]
    with pytest.raises(errors.ModelVersionConflict):
        client.create_model("mnist")


def test_cluster_only_calls_say_what_to_use(written):
    with pytest.raises(errors.NotSupported, match="ckptstore experiment create"):
        client.create_experiment({"searcher": {}}, ".")
    with pytest.raises(errors.NotSupported, match="SIGTERM"):
        client.get_trial(written["trials"][0]).kill()
    client.login(master="https://old-master:8080", user="determined")  # accepted, no master
    with pytest.raises(errors.CheckpointNotFound):
        client.get_checkpoint("00000000-0000-4000-8000-000000000000")


def test_experiment_name_description_and_labels(written):
    exp = client.get_experiment(written["experiment_id"])
    exp.set_name("renamed")
    exp.set_description("what it tried")
    exp.set_labels(["a", "b"])
    exp.add_label("c")
    exp.remove_label("a")
    again = client.get_experiment(written["experiment_id"])
    assert (again.name, again.description, again.labels) == ("renamed", "what it tried", ["b", "c"])
    assert again.config["searcher"]["metric"] == "val_loss"  # the rest of the config is kept
    assert [e.id for e in client.list_experiments(labels=["c"])] == [again.id]
    with pytest.raises(errors.InvalidConfig, match="list of strings"):
        exp.set_labels("a")


def test_tensorboard_files_uploaded_by_a_trial_and_deleted_by_the_sdk(written, local_and_s3_url):
    with det.core.init(
        storage=local_and_s3_url,
        registry=written["registry"],
        experiment_id=written["experiment_id"],
        preempt_signals=False,
        tensorboard_mode=det.core.TensorboardMode.MANUAL,
    ) as core_context:
        trial_id = core_context.info.trial.trial_id
        (core_context.train.get_tensorboard_path() / "events.1").write_bytes(b"e1")
        core_context.train.report_training_metrics(1, {"loss": 1.0})  # MANUAL: no upload
        storage = core_context.storage
        assert storage.list(f"tensorboard/{trial_id}") == {}
        core_context.train.upload_tensorboard_files()
        assert storage.list(f"tensorboard/{trial_id}") == {"events.1": 2}
        client.get_experiment(written["experiment_id"]).delete_tensorboard_files()
        assert storage.list(f"tensorboard/{trial_id}") == {}


def test_a_task_using_a_model_version_keeps_its_checkpoint_from_gc(written):
    best = client.get_experiment(written["experiment_id"]).top_checkpoint()
    version = client.create_model("served").register_version(best.uuid)
    other = client.get_trial(written["trials"][0]).select_checkpoint(latest=True)
    with det.core.init(
        storage=written["storage"], registry=written["registry"],
        preempt_signals=False,
    ) as core_context:  # fmt: skip
        core_context.experimental.report_task_using_model_version(version)
        core_context.experimental.report_task_using_checkpoint(other)
        with Registry(written["registry"]) as registry:
            assert {best.uuid, other.uuid} <= registry.protected_checkpoint_uuids()
        with pytest.raises(errors.InvalidConfig, match="client.Checkpoint"):
            core_context.experimental.report_task_using_checkpoint(42)
    with Registry(written["registry"]) as registry:
        assert other.uuid not in registry.protected_checkpoint_uuids()  # released on exit


def test_a_checkpoint_row_naming_another_storage_downloads_only_when_allowed(written, monkeypatch):
    """Issue 27, finding 2: with only the registry configured, the storage a row recorded is
    read when CKPTSTORE_STORAGE or CKPTSTORE_ALLOWED_STORAGE covers it, or (issue 39) when it
    is an S3/GCS/Azure bucket read with the caller's own credentials; a local path outside
    the storages the process knows, never."""
    from ckptstore.checkpointing.row_storage import ALLOWED_STORAGE_ENV

    monkeypatch.delenv(ALLOWED_STORAGE_ENV, raising=False)
    monkeypatch.delenv("CKPTSTORE_STORAGE", raising=False)
    monkeypatch.setenv("CKPTSTORE_HOME", str(written["tmp"] / "home"))  # the default: elsewhere
    client.configure(registry=written["registry"])
    uuid = client.get_trial(written["trials"][0]).select_checkpoint(latest=True).uuid
    if written["storage"].startswith("s3://"):  # the user's own load follows a bucket URL
        path = client.get_checkpoint(uuid).download(str(written["tmp"] / "followed"))
        assert open(os.path.join(path, "sub", "note.txt")).read().startswith("loss")
        return
    with pytest.raises(errors.StorageNotAllowed, match=ALLOWED_STORAGE_ENV):
        client.get_checkpoint(uuid).download(str(written["tmp"] / "refused"))
    assert not os.path.exists(written["tmp"] / "refused" / "sub")
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, written["storage"])
    client.configure(registry=written["registry"])
    path = client.get_checkpoint(uuid).download(str(written["tmp"] / "allowed"))
    assert open(os.path.join(path, "sub", "note.txt")).read() == "loss 0.6"
