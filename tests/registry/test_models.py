"""Model registry on SQLite and PostgreSQL: versions, aliases, labels, metadata, archive, delete."""

from __future__ import annotations

import getpass

import pytest

from ckptstore import errors
from ckptstore.checkpointing.index import CheckpointRecord
from ckptstore.registry import Model, ModelVersion, Registry


@pytest.fixture
def seeded(registry_url):
    with Registry(registry_url) as reg:
        for i, state in enumerate(
            ["COMMITTED", "COMMITTED", "PARTIALLY_DELETED", "PENDING", "DELETED"]
        ):
            reg.record_checkpoint(
                CheckpointRecord(uuid=f"ck{i}", trial_id=1, steps_completed=i * 10, state=state)
            )
        yield reg


def test_create_get_list_and_conflict(seeded):
    model = seeded.create_model(
        "mnist", description="cnn", labels=["a", "b", "a"], metadata={"k": 1}
    )
    assert isinstance(model, Model)
    assert (model.name, model.description, model.labels, model.metadata, model.archived) == (
        "mnist",
        "cnn",
        ["a", "b"],
        {"k": 1},
        False,
    )
    assert seeded.get_model("mnist").description == "cnn"
    seeded.create_model("alpha")
    assert [m.name for m in seeded.list_models()] == ["alpha", "mnist"]
    with pytest.raises(errors.ModelVersionConflict, match="mnist"):
        seeded.create_model("mnist")
    with pytest.raises(errors.ModelNotFound, match="nope"):
        seeded.get_model("nope")
    with pytest.raises(errors.InvalidConfig):
        seeded.create_model("")


def test_versions_numbering_and_checkpoint_rules(seeded):
    model = seeded.create_model("m")
    with pytest.raises(errors.ModelNotFound, match="no versions"):
        model.get_version()
    v1 = model.register_version("ck0")
    v2 = model.register_version("ck2")  # PARTIALLY_DELETED is allowed
    assert isinstance(v1, ModelVersion)
    assert (v1.model_name, v1.version, v1.checkpoint_uuid, v1.checkpoint.uuid) == (
        "m",
        1,
        "ck0",
        "ck0",
    )
    assert v2.version == 2 and v2.checkpoint.state == "PARTIALLY_DELETED"
    assert model.get_version().version == 2
    assert model.get_version(-1).checkpoint.uuid == "ck2"
    assert model.get_version(1).checkpoint.uuid == "ck0"
    with pytest.raises(errors.CheckpointNotFound, match="missing"):
        model.register_version("missing")
    with pytest.raises(errors.CheckpointNotFound, match="PENDING"):
        model.register_version("ck3")
    with pytest.raises(errors.CheckpointNotFound, match="DELETED"):
        model.register_version("ck4")
    with pytest.raises(errors.ModelNotFound):
        model.get_version(7)
    with pytest.raises(errors.InvalidConfig):
        model.get_version(1.5)  # type: ignore[arg-type]

    v2.delete()
    v3 = model.register_version("ck1")
    assert v3.version == 3  # numbers are never reused
    assert [v.version for v in model.list_versions()] == [1, 3]


def test_aliases_unique_per_model(seeded):
    model = seeded.create_model("m")
    other = seeded.create_model("other")
    model.register_version("ck0")
    model.register_version("ck1")
    other.register_version("ck1")
    model.set_alias(1, "production")
    other.set_alias(1, "production")  # same alias name on another model is fine
    assert model.get_version("production").version == 1
    assert model.get_version(1).aliases == ["production"]
    model.set_alias(2, "production")  # moves, taking it from version 1
    assert model.get_version("production").version == 2
    assert model.get_version(1).aliases == []
    assert model.get_version(2).aliases == ["production"]
    assert other.get_version("production").version == 1
    model.set_alias(2, "staging")
    assert model.get_version(2).aliases == ["production", "staging"]
    model.remove_alias("production")
    with pytest.raises(errors.ModelNotFound, match="production"):
        model.get_version("production")
    with pytest.raises(errors.ModelNotFound):
        model.remove_alias("production")
    with pytest.raises(errors.InvalidConfig):
        model.set_alias(2, "3")
    with pytest.raises(errors.ModelNotFound):
        model.set_alias(9, "x")
    assert model.get_version("2").version == 2  # a numeric string means the number
    # Every move is recorded, newest first: who (default: the OS user), from which version.
    model.set_alias(1, "production", by="release bot")
    moves = [
        (m["alias"], m["version"], m["previous"], m["moved_by"]) for m in model.alias_history()
    ]
    user = getpass.getuser()
    assert moves == [
        ("production", 1, None, "release bot"),
        ("production", None, 2, user),  # removed
        ("staging", 2, None, user),
        ("production", 2, 1, user),
        ("production", 1, None, user),
    ]
    assert [m["alias"] for m in model.alias_history("staging")] == ["staging"]
    assert len(model.alias_history(limit=2)) == 2
    assert [m["moved_by"] for m in other.alias_history()] == [user]  # per model
    assert model.alias_history()[0]["moved_at"].tzinfo is not None
    model.delete()
    again = seeded.create_model("m")
    assert again.alias_history() == []  # a deleted model takes its history with it


def test_labels_description_metadata_notes(seeded):
    model = seeded.create_model("m", labels=["x"])
    model.add_labels(["y", "x", "z"])
    assert model.labels == ["x", "y", "z"]
    model.remove_labels("y")
    assert seeded.get_model("m").labels == ["x", "z"]
    model.set_description("new")
    model.add_metadata({"a": 1, "b": {"c": 2}})
    model.add_metadata({"a": 3})
    model.remove_metadata(["b", "absent"])
    fresh = seeded.get_model("m")
    assert (fresh.description, fresh.metadata) == ("new", {"a": 3})
    version = model.register_version("ck0")
    version.set_notes("trained on v2 data")
    assert model.get_version(1).notes == "trained on v2 data"
    with pytest.raises(errors.InvalidConfig):
        model.add_labels([""])


def test_archive_unarchive_delete_and_protection(seeded):
    model = seeded.create_model("m")
    model.register_version("ck0")
    keep = seeded.create_model("keep")
    keep.register_version("ck1")
    keep.register_version("ck1")
    assert seeded.protected_checkpoint_uuids() == {"ck0", "ck1"}

    model.archive()
    assert model.archived and [m.name for m in seeded.list_models()] == ["keep"]
    assert [m.name for m in seeded.list_models(include_archived=True)] == ["keep", "m"]
    with pytest.raises(errors.RegistryError, match="archived"):
        model.register_version("ck1")
    with pytest.raises(errors.RegistryError, match="unarchive"):
        model.set_description("x")
    assert "ck0" in seeded.protected_checkpoint_uuids()  # archived versions still pin
    model.unarchive()
    assert not seeded.get_model("m").archived

    model.delete()
    with pytest.raises(errors.ModelNotFound):
        seeded.get_model("m")
    assert seeded.protected_checkpoint_uuids() == {"ck1"}
    assert seeded.get_checkpoint("ck0").state == "COMMITTED"  # the checkpoint stays
    keep.get_version(1).delete()
    assert seeded.protected_checkpoint_uuids() == {"ck1"}
    keep.get_version(2).delete()
    assert seeded.protected_checkpoint_uuids() == set()
