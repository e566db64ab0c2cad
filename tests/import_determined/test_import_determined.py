"""`ckptstore import-determined` / import_determined(): registered, listed, loadable."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.import_determined.layouts import detect_layout, import_determined
from ckptstore.import_determined.weights import load_determined_checkpoint
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests.cli.helpers import make_env
from tests.import_determined import determined_fixtures as fx


@pytest.fixture
def det_folder(tmp_path):
    """A folder of three Determined checkpoints, one per layout."""
    root = tmp_path / "det"
    values = {name: fx.make_values(seed) for seed, name in enumerate(("cb", "trial", "h5"))}
    fx.write_callback_checkpoint(str(root / "cb"), values["cb"], steps_completed=40)
    fx.write_tfkeras_trial_checkpoint(
        str(root / "trial"),
        values["trial"],
        steps_completed=100,
        marker=str(tmp_path / "unpickled"),
    )
    fx.write_h5_model_checkpoint(str(root / "h5"), values["h5"])
    return root, values


def test_cli_import_folder_lists_and_loads(tmp_path, det_folder):
    root, values = det_folder
    env = make_env(tmp_path)
    result = env.run("import-determined", str(root), "--trial", "5", "--json")
    assert result.exit_code == 0, result.output
    imported = json.loads(result.stdout)
    assert [(i["layout"], i["steps_completed"]) for i in imported] == [
        ("tfkeras_h5", 20),
        ("callback", 40),
        ("tfkeras_trial", 100),
    ]
    assert "--trust-pickle" in result.stderr and "callback_state" in result.stderr
    assert not (tmp_path / "unpickled").exists()  # the pickle payload never ran

    listed = {r["uuid"]: r for r in env.json("checkpoint", "list", "--trial", "5")}
    assert set(listed) == {i["uuid"] for i in imported}
    assert {r["steps_completed"] for r in listed.values()} == {20, 40, 100}

    by_layout = {i["layout"]: i["uuid"] for i in imported}
    described = env.json("checkpoint", "describe", by_layout["callback"])
    assert described["metadata"]["determined"]["layout"] == "callback"
    assert described["metadata"]["determined"]["pickles_skipped"] == ["callback_state"]
    assert (
        "callback_state" in described["resources"]
        and "determined_metadata.json" in described["resources"]
    )
    assert env.run("checkpoint", "verify", by_layout["tfkeras_trial"]).exit_code == 0

    # downloaded from ckptstore, each loads into a fresh Keras 3 model
    for layout, key in (("callback", "cb"), ("tfkeras_trial", "trial"), ("tfkeras_h5", "h5")):
        out = tmp_path / f"dl-{layout}"
        assert env.run("checkpoint", "download", by_layout[layout], "-o", str(out)).exit_code == 0
        model = fx.build_keras_model()
        result = load_determined_checkpoint(model, str(out))
        assert result.layout == layout
        for variable, expected in zip(model.weights, values[key]["weights"], strict=True):
            np.testing.assert_array_equal(np.asarray(variable), expected)
        np.testing.assert_array_equal(
            np.asarray(model.optimizer._momentums[0]), values[key]["m"][0]
        )
    assert not (tmp_path / "unpickled").exists()


def test_trust_pickle_imports_callback_state(tmp_path):
    folder = fx.write_callback_checkpoint(
        str(tmp_path / "cb"), fx.make_values(9), epoch=6, continue_id=77
    )
    with Registry(f"sqlite:///{tmp_path / 'reg.db'}") as registry:
        [item] = import_determined(
            folder, storage=str(tmp_path / "store"), index=registry, trial_id=2, trust_pickle=True
        )
        assert item.pickles_skipped == []
        ckpt = registry.get_checkpoint(item.uuid)
        assert ckpt.trial_id == 2 and ckpt.steps_completed == 40
        assert ckpt.continue_id == 77
        assert ckpt.metadata["epoch"] == 6
        assert ckpt.metadata["determined"]["callback_state"]["continue_id"] == 77


def test_import_from_s3_url(tmp_path, storage_url_factory):
    src_url = storage_url_factory("s3")
    local = fx.write_tfkeras_trial_checkpoint(
        str(tmp_path / "t"), fx.make_values(3), steps_completed=12
    )
    with open_storage(src_url) as src:
        src.upload(local, "run-1/ckpt-a")
    env = make_env(tmp_path)
    result = env.run("import-determined", src_url + "/run-1", "--trial", "1", "--json")
    assert result.exit_code == 0, result.output
    [item] = json.loads(result.stdout)
    assert item["source"].endswith("run-1/ckpt-a") and item["steps_completed"] == 12
    out = tmp_path / "out"
    assert env.run("checkpoint", "download", item["uuid"], "-o", str(out)).exit_code == 0
    model = fx.build_keras_model()
    load_determined_checkpoint(model, str(out))
    np.testing.assert_array_equal(np.asarray(model.weights[0]), fx.make_values(3)["weights"][0])


def test_import_rejects_non_checkpoints(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    env = make_env(tmp_path)
    result = env.run("import-determined", str(tmp_path / "empty"))
    assert result.exit_code == 5 and "No Determined checkpoint" in result.output
    assert env.run("import-determined", str(tmp_path / "missing")).exit_code == 2
    with pytest.raises(errors.InvalidConfig):
        import_determined(str(tmp_path / "missing"), storage=str(tmp_path / "store"))


@pytest.mark.parametrize(
    "names, layout",
    [
        (
            {"checkpoint", "model_checkpoint.index", "model_checkpoint.data-00000-of-00001"},
            "callback",
        ),
        ({"determined-keras-model-weights.index", "load_data.json"}, "tfkeras_trial"),
        ({"determined-keras-model.h5", "metadata.json"}, "tfkeras_h5"),
        ({"model.keras", "metadata.json"}, None),
    ],
)
def test_detect_layout(names, layout):
    assert detect_layout(names) == layout


def test_import_refuses_a_file_name_the_reader_would_refuse(tmp_path):
    """Issue 15 item 1 on the import path: a Determined checkpoint holding a file named with a
    backslash is refused with a typed error naming it, and nothing is committed or registered."""
    root = tmp_path / "det"
    fx.write_h5_model_checkpoint(str(root / "h5"), fx.make_values(0))
    (root / "h5" / "notes\\old.txt").write_bytes(b"x")
    env = make_env(tmp_path)
    result = env.run("import-determined", str(root), "--trial", "5")
    assert result.exit_code == 2, result.output
    assert "notes\\\\old.txt" in result.output and "Unsafe entry" in result.output
    assert env.json("checkpoint", "list", "--all") == []
    assert not os.path.exists(env.storage_url) or os.listdir(env.storage_url) == []
