"""One owner per rule: the checkpoint content rule on every write path, the JSON policy, the
int validator. Each rule is tested here once; its users are tested by behaviour."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.jsonsafe import MAX_DEPTH, to_json
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from ckptstore.storage_backends.paths import check_key
from ckptstore.validators import int_at_least, number_at_least

BAD_NAMES = [
    "back\\slash.txt",
    "x:y.txt",
    "tab\tthere.txt",
    "nl\n.txt",
    "del\x7f",
    "c1\x85",
    "n" * 256,
    "bad\udcff.bin",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_key_rule_refuses(name):
    with pytest.raises(errors.InvalidStoragePath):
        check_key(name)
    with pytest.raises(errors.UnsafeCheckpointPath, match="Unsafe entry"):
        fmt.check_entry(name)


@pytest.mark.parametrize(
    "name", ["ünï cödé/ä.txt", "CON", "aux.txt", "sub/x:y.txt", "a" * 255, "emoji 🎉/\u2028sep"]
)
def test_the_key_rule_accepts(name):
    assert check_key(name) == name
    assert fmt.check_entry(name) == name


def _write(folder: str, name: str) -> None:
    path = os.path.join(os.fsencode(folder), os.fsencode(name))
    with open(path, "wb") as f:
        f.write(b"x")


def _nothing_committed(ctx: CheckpointContext) -> None:
    assert scan.list_committed(ctx.storage) == []
    assert ctx.latest_checkpoint() is None
    assert ctx.index.checkpoint_records(trial_id=1) == []


WRITE_PATHS = ["store_path", "store_path_background", "upload", "upload_background", "upload_move"]


@pytest.mark.parametrize("path_kind", WRITE_PATHS)
@pytest.mark.parametrize("name", ["back\\slash.txt", "x:y.txt", "tab\tthere.txt"])
def test_every_write_path_refuses_before_commit(local_and_s3_url, tmp_path, path_kind, name):
    """Issue 15 item 1: the writer refuses what the reader would refuse, naming the file, on
    local (rename) and object storage, in the foreground and in the background."""
    registry = Registry(f"sqlite:///{tmp_path}/r.db")
    registry.ensure_trial(1)
    with CheckpointContext(local_and_s3_url, index=registry, trial_id=1) as ctx:
        with pytest.raises(errors.UnsafeCheckpointPath) as caught:
            if path_kind.startswith("store_path"):
                with ctx.store_path(
                    {"steps_completed": 1}, background=path_kind.endswith("background")
                ) as (p, _):
                    _write(p, "ok.txt")
                    _write(p, name)
            else:
                src = tmp_path / "src"
                src.mkdir()
                _write(str(src), "ok.txt")
                _write(str(src), name)
                ctx.upload(
                    src,
                    {"steps_completed": 1},
                    background=path_kind == "upload_background",
                    move=path_kind == "upload_move",
                )
        assert repr(name)[1:-1] in str(caught.value)
        ctx.wait()
        _nothing_committed(ctx)
    registry.close()


def test_json_policy():
    got = to_json(
        {
            "a": math.nan,
            "b": [math.inf, -math.inf, 1.5],
            3: np.float32(2.0),
            "t": (1, "x"),
            "n": None,
            "i": np.int64(7),
        }
    )
    assert got == {"a": None, "b": [None, None, 1.5], "3": 2.0, "t": [1, "x"], "n": None, "i": 7}
    deep: object = 1
    for _ in range(MAX_DEPTH + 1):
        deep = {"k": deep}
    for bad in [{(1, 2): 1}, {1: "a", "1": "b"}, {"o": object()}, deep, {"s": "\udcff"}, {True: 1}]:
        with pytest.raises(errors.InvalidConfig, match="JSON"):
            to_json(bad)


def test_int_validator():
    assert int_at_least("n", 3, 1) == 3
    assert int_at_least("n", np.int64(3), 0) == 3
    for bad in [True, 0, 1.0, "1", None, math.inf]:
        with pytest.raises(errors.InvalidConfig, match=r"Received: n="):
            int_at_least("n", bad, 1)
    assert number_at_least("t", 0.5, 0, strict=True) == 0.5
    for bad in [0, math.nan, math.inf, True, "1"]:
        with pytest.raises(errors.InvalidConfig):
            number_at_least("t", bad, 0, strict=True)


@pytest.mark.parametrize("steps", [math.inf, "ten", -1, 2.5, None])
def test_bad_steps_completed_is_typed(tmp_path, steps):
    with CheckpointContext(str(tmp_path / "s")) as ctx:
        with pytest.raises(errors.InvalidConfig, match="steps_completed"):
            with ctx.store_path({"steps_completed": steps}) as (p, _):
                _write(p, "f")
        assert scan.list_committed(ctx.storage) == []


def test_deeply_nested_metadata_is_typed(tmp_path):
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    with CheckpointContext(str(tmp_path / "s")) as ctx:
        with pytest.raises(errors.InvalidConfig, match="nested deeper"):
            with ctx.store_path({"deep": deep}) as (p, _):
                _write(p, "f")
        assert scan.list_committed(ctx.storage) == []


def test_nan_metrics_commit_on_sqlite_and_postgresql(registry_url, tmp_path):
    """Issue 15 item 6: NaN/inf in checkpoint metrics and metadata become null in metadata.json
    (strict JSON) and in the registry, on both databases; the reported metrics too."""
    with Registry(registry_url) as registry:
        trial_id = registry.create_trial(hparams={"lr": math.nan})
        with CheckpointContext(str(tmp_path / "s"), index=registry, trial_id=trial_id) as ctx:
            with ctx.store_path(
                {"steps_completed": 1, "metrics": {"val_loss": math.nan}, "extra": {"x": math.inf}}
            ) as (p, uuid):
                _write(p, "f")
            raw = (tmp_path / "s" / uuid / "metadata.json").read_text()
            assert "NaN" not in raw and "Infinity" not in raw
        row = registry.get_checkpoint(uuid)
        assert row.metrics == {"val_loss": None} and row.metadata["extra"] == {"x": None}
        assert registry.get_trial(trial_id).hparams == {"lr": None}
        registry.report_metrics(trial_id, "validation", 1, {"val_loss": -math.inf})
        assert registry.get_metrics(trial_id, "validation")[0].metrics == {"val_loss": None}


def test_the_one_metric_lookup():
    from ckptstore.checkpointing.metrics import metric_value

    assert metric_value({"val_loss": 1}, "val_loss") == 1.0
    assert metric_value({"validation_metrics": {"val_loss": 2.5}}, "val_loss") == 2.5
    assert metric_value({"avg_metrics": {"val_loss": 3}}, "val_loss") == 3.0
    assert metric_value({"val_loss": 1, "validation_metrics": {"val_loss": 2}}, "val_loss") == 1
    assert metric_value({"val_accuracy": 0.9}, "accuracy") == 0.9
    assert metric_value({"accuracy": 0.9}, "val_accuracy") == 0.9
    # NaN counts as absent: the nested finite value is used, a lone NaN is no value.
    assert metric_value({"val_loss": math.nan, "validation_metrics": {"val_loss": 4}}, "val_loss")
    assert metric_value({"val_loss": math.nan}, "val_loss") is None
    assert metric_value({"val_loss": True}, "val_loss") is None
    assert metric_value({"val_loss": "0.1"}, "val_loss") is None
    assert metric_value(None, "val_loss") is None
    # Reporting (to the searcher) keeps a diverged NaN; ranking skips it.
    from ckptstore.checkpointing.metrics import reported_value

    assert math.isnan(reported_value({"val_loss": math.nan}, "loss"))
    assert reported_value({"acc": 1}, "val_loss") is None


def test_gc_registry_and_loader_agree_on_best(tmp_path):
    """Issue 12: load_checkpoint_model(best_by=) (with and without registry rows), the
    registry's best_checkpoint and GC's best rule pick the same checkpoint."""
    from ckptstore.checkpointing.retention import BestN, GCContext
    from ckptstore.keras_io.loading._loaders import resolve_checkpoint

    shapes = [
        {"val_loss": math.nan, "avg_metrics": {"val_loss": 0.05}},  # NaN flat, finite nested
        {"validation_metrics": {"val_loss": 0.1}},
        {"loss": 0.01},  # only a training-style name: found through the val_ alias rule
        {"val_loss": math.nan},
    ]
    url = str(tmp_path / "s")
    with Registry(f"sqlite:///{tmp_path}/r.db") as registry:
        registry.ensure_trial(1)
        with CheckpointContext(url, index=registry, trial_id=1) as ctx:
            uuids = []
            for steps, metrics in enumerate(shapes, 1):
                with ctx.store_path({"steps_completed": steps, "metrics": metrics}) as (p, u):
                    _write(p, "f")
                uuids.append(u)
        records = registry.checkpoint_records(trial_id=1)
        gc_keep = BestN(1, "val_loss").should_preserve(records, context=GCContext())
        gc_best = [r.uuid for r, keep in zip(records, gc_keep, strict=True) if keep]
        from_registry = registry.best_checkpoint(trial_id=1, metric="val_loss").uuid
        with_rows = resolve_checkpoint(
            registry, lambda _url=None: open_storage(url), 1, None, "val_loss"
        )[0]
    with Registry(f"sqlite:///{tmp_path}/empty.db") as empty:
        storage_only = resolve_checkpoint(
            empty, lambda _url=None: open_storage(url), 1, None, "val_loss"
        )[0]
    assert gc_best == [from_registry] == [with_rows] == [storage_only] == [uuids[2]]


def test_positional_download_mode_downloads_or_raises_typed(tmp_path):
    """Issue 15 item 8: Determined's download(uuid, path, mode) positional call downloads every
    file, and a value that is not a core DownloadMode (the SDK's DownloadMode.DIRECT, a glob
    meant as a selector) raises a typed error instead of silently downloading nothing."""
    from ckptstore.core import DownloadMode
    from ckptstore.experimental.client import DownloadMode as SdkDownloadMode

    with CheckpointContext(str(tmp_path / "s")) as ctx:
        with ctx.store_path({"steps_completed": 1}) as (p, uuid):
            _write(p, "model.keras")
        for mode in (DownloadMode.NoSharedDownload, DownloadMode.LocalWorkersShareDownload):
            dest = tmp_path / mode.name
            ctx.download(uuid, dest, mode)
            assert sorted(os.listdir(dest)) == ["metadata.json", "model.keras"]
            with ctx.restore_path(uuid, mode) as path:
                assert os.path.isfile(os.path.join(path, "model.keras"))
        for wrong in (SdkDownloadMode.DIRECT, "*.keras", None):
            with pytest.raises(errors.InvalidConfig, match="download_mode"):
                ctx.download(uuid, tmp_path / "x", wrong)
            assert not (tmp_path / "x").exists() or os.listdir(tmp_path / "x") == []
