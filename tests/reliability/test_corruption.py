"""Damaged checkpoints in storage: flipped bytes, truncated and missing files, bad or truncated
``MANIFEST.json`` / ``metadata.json``.

Each is detected with a typed error naming the file. A bad manifest means "not a
checkpoint": listing, ``latest_checkpoint``, GC, registry reindex and ``ckptstore checkpoint
list`` carry on without it and never crash.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from click.testing import CliRunner

from ckptstore import errors
from ckptstore.checkpointing import (
    CheckpointContext,
    LatestN,
    is_committed,
    list_committed,
    scan_checkpoints,
)
from ckptstore.cli.main import cli
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree

pytestmark = pytest.mark.timeout(120)

FILES = ("weights.bin", "nested/optimizer.bin", "config.json")


def _make_ckpt(root, seed: int) -> None:
    rng = random.Random(seed)
    data = {
        "weights.bin": rng.randbytes(40_000),
        "nested/optimizer.bin": rng.randbytes(10_000),
        "config.json": json.dumps({"seed": seed}).encode(),
    }
    make_tree(root, data)


class Setup:
    """Two committed checkpoints of trial 1 (``good`` older, ``victim`` newer)."""

    def __init__(self, url: str, tmp_path) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
        self.registry = Registry(self.registry_url)
        self.storage = open_storage(url)
        # Whole files (format 1) on every storage: these tests damage files in the folder;
        # damaged deduplicated chunks are tests/checkpointing/test_dedup.py's.
        self.ctx = CheckpointContext(self.storage, index=self.registry, trial_id=1, dedup=False)
        self.uuids = []
        for step in (1, 2):
            src = tmp_path / f"src-{step}"
            _make_ckpt(src, step)
            self.uuids.append(self.ctx.upload(src, {"steps_completed": step}))
        self.good, self.victim = self.uuids

    def key(self, rel: str) -> str:
        return f"{self.victim}/{rel}"

    def read(self, rel: str) -> bytes:
        return self.storage.read_bytes(self.key(rel))

    def write(self, rel: str, data: bytes) -> None:
        """Overwrite a stored file (local files may be read-only after commit)."""
        local = self.storage.local_path(self.key(rel))
        if local is not None and os.path.exists(local):
            os.chmod(local, 0o644)
            os.chmod(os.path.dirname(local), 0o755)
        self.storage.write_bytes(self.key(rel), data)

    def remove(self, rel: str) -> None:
        local = self.storage.local_path(self.victim)
        if local is not None:
            for root, _dirs, _files in os.walk(local):
                os.chmod(root, 0o755)
        self.storage.delete(self.key(rel))

    def cli(self, *args: str):
        runner = CliRunner()
        return runner.invoke(
            cli,
            ["--storage", self.url, "--registry", self.registry_url, *args],
            catch_exceptions=False,
        )

    def close(self) -> None:
        self.ctx.close()
        self.storage.close()
        self.registry.close()


@pytest.fixture(params=["file", "s3"])
def setup(request, storage_url_factory, tmp_path):
    """Parametrized over file and s3; a test can narrow it with indirect parametrization."""
    s = Setup(storage_url_factory(request.param), tmp_path)
    yield s
    s.close()


def _cases(full: list, on_s3: list) -> list:
    """Every case on local files, a few of them also on S3 (keeps the suite fast)."""
    out = [pytest.param("file", *c, id="-".join(["file", *map(str, c)])) for c in full]
    out += [pytest.param("s3", *c, id="-".join(["s3", *map(str, c)])) for c in on_s3]
    return out


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


# ---- damaged data files: ChecksumMismatch naming the file ---------------------------------------
DAMAGE = {
    "flipped-byte": lambda s, rel: s.write(rel, _flip(s.read(rel), len(s.read(rel)) // 2)),
    "truncated": lambda s, rel: s.write(rel, s.read(rel)[: len(s.read(rel)) // 3]),
    "missing": lambda s, rel: s.remove(rel),
    "empty": lambda s, rel: s.write(rel, b""),
}


@pytest.mark.parametrize(
    "setup,damage,rel",
    _cases(
        [(d, r) for d in sorted(DAMAGE) for r in ("weights.bin", "nested/optimizer.bin")],
        [("flipped-byte", "weights.bin"), ("missing", "nested/optimizer.bin")],
    ),
    indirect=["setup"],
)
def test_damaged_file_is_detected_naming_it(setup, damage, rel, tmp_path):
    DAMAGE[damage](setup, rel)
    with pytest.raises(errors.ChecksumMismatch, match=rel.replace(".", r"\.")):
        setup.ctx.download(setup.victim, tmp_path / "out")
    with pytest.raises(errors.ChecksumMismatch, match=rel.replace(".", r"\.")):
        with setup.ctx.restore_path(setup.victim):
            pass
    # the undamaged checkpoint still loads
    setup.ctx.download(setup.good, tmp_path / "good")
    # `ckptstore checkpoint verify` reports it with the corruption exit code, naming the file
    result = setup.cli("checkpoint", "verify", setup.victim)
    assert result.exit_code == 5, result.output
    assert rel in result.output
    assert setup.cli("checkpoint", "verify", setup.good).exit_code == 0


@pytest.mark.parametrize("setup", ["file"], indirect=True)
def test_verify_false_skips_the_check(setup, tmp_path):
    setup.write("weights.bin", _flip(setup.read("weights.bin"), 7))
    with CheckpointContext(setup.storage, verify=False) as ctx:
        ctx.download(setup.victim, tmp_path / "out")
    assert (tmp_path / "out" / "weights.bin").exists()


# ---- damaged metadata.json ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "setup,damage",
    _cases(
        [("truncated",), ("not-json",), ("not-an-object",), ("flipped-byte",), ("missing",)],
        [("truncated",)],
    ),
    indirect=["setup"],
)
def test_damaged_metadata_is_detected_naming_it(setup, damage, tmp_path):
    original = setup.read("metadata.json")
    bad = {
        "truncated": original[: len(original) // 2],
        "not-json": b"\x00\xffgarbage",
        "not-an-object": b"[1, 2, 3]",
        "flipped-byte": original.replace(b'"steps_completed": 2', b'"steps_completed": 3'),
    }
    if damage == "missing":
        setup.remove("metadata.json")
    else:
        setup.write("metadata.json", bad[damage])
    # a download always checks metadata.json against the manifest
    with pytest.raises((errors.ChecksumMismatch, errors.InvalidCheckpoint), match="metadata.json"):
        setup.ctx.download(setup.victim, tmp_path / "out")
    if damage != "flipped-byte":  # well-formed JSON cannot be told apart without the manifest
        with pytest.raises(errors.InvalidCheckpoint, match="metadata.json"):
            setup.ctx.get_metadata(setup.victim)
        # a scan skips it (with a warning) instead of crashing
        assert setup.victim not in [r.uuid for r in scan_checkpoints(setup.storage)]
    assert setup.good in [r.uuid for r in scan_checkpoints(setup.storage)]
    setup.registry.reindex(setup.storage)
    result = setup.cli("checkpoint", "list", "--json")
    assert result.exit_code == 0, result.output
    assert setup.good in result.output


# ---- damaged MANIFEST.json: "not a checkpoint" --------------------------------------------------
def _bad_manifests(original: bytes) -> dict[str, bytes | None]:
    manifest = json.loads(original)
    no_files = dict(manifest)
    no_files.pop("files")
    bad_crc = json.loads(original)
    bad_crc["files"]["weights.bin"]["crc32c"] = "not-hex!"
    future = dict(manifest, format_version=999)
    return {
        "truncated": original[: len(original) // 2],
        "garbage": b"\x89PNG\r\n\x1a\n\x00\x00",
        "empty": b"",
        "no-files": json.dumps(no_files).encode(),
        "bad-entry": json.dumps(bad_crc).encode(),
        "future-version": json.dumps(future).encode(),
        "list": b"[]",
        "missing": None,
    }


MANIFEST_CASES = sorted(_bad_manifests(b'{"format_version": 1, "files": {"weights.bin": {}}}'))


@pytest.mark.parametrize(
    "setup,damage",
    _cases([(c,) for c in MANIFEST_CASES], [("truncated",), ("missing",)]),
    indirect=["setup"],
)
def test_bad_manifest_means_not_a_checkpoint(setup, damage, tmp_path):
    bad = _bad_manifests(setup.read("MANIFEST.json"))[damage]
    if bad is None:
        setup.remove("MANIFEST.json")
    else:
        setup.write("MANIFEST.json", bad)

    assert not is_committed(setup.storage, setup.victim)
    assert list_committed(setup.storage) == [setup.good]
    assert [r.uuid for r in scan_checkpoints(setup.storage)] == [setup.good]
    # storage-only latest skips it
    with CheckpointContext(setup.storage, trial_id=1) as plain:
        assert plain.latest_checkpoint() == setup.good
    # reading it is a typed error naming the manifest
    with pytest.raises(errors.CheckpointError, match="MANIFEST.json"):
        setup.ctx.download(setup.victim, tmp_path / "out")
    with pytest.raises(errors.CheckpointError, match="MANIFEST.json"):
        setup.ctx.get_metadata(setup.victim)
    # GC does not crash on it and does not touch the good one
    with CheckpointContext(
        setup.storage, index=setup.registry, trial_id=1, gc_policy=LatestN(5), gc_grace_seconds=0
    ) as gc_ctx:
        gc_ctx.gc()
    assert list_committed(setup.storage) == [setup.good]
    # the registry, rebuilt from storage, no longer offers it
    setup.registry.reindex(setup.storage)
    latest = setup.registry.latest_checkpoint(1)
    assert latest is not None and latest.uuid == setup.good
    assert setup.ctx.latest_checkpoint() == setup.good
    # and the CLI lists without crashing
    for args in (("checkpoint", "list"), ("checkpoint", "list", "--json", "--all")):
        result = setup.cli(*args)
        assert result.exit_code == 0, result.output
        assert setup.good in result.output
    fresh = tmp_path / "fresh.db"
    runner = CliRunner()
    result = runner.invoke(
        cli, ["--storage", setup.url, "--registry", f"sqlite:///{fresh}", "reindex", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["checkpoints"] == 1


def test_manifest_of_another_checkpoint_is_rejected(setup, tmp_path):
    """A manifest copied from another checkpoint (names another UUID) is not accepted."""
    other = setup.storage.read_bytes(f"{setup.good}/MANIFEST.json")
    setup.write("MANIFEST.json", other)
    assert not is_committed(setup.storage, setup.victim)
    with pytest.raises(errors.InvalidCheckpoint, match="MANIFEST.json"):
        setup.ctx.download(setup.victim, tmp_path / "out")


def test_extra_file_not_in_manifest_is_never_downloaded(setup, tmp_path):
    setup.write("injected.py", b"import os; os.system('echo pwned')")
    setup.ctx.download(setup.victim, tmp_path / "out")
    assert not (tmp_path / "out" / "injected.py").exists()
    assert sorted(
        os.path.relpath(os.path.join(r, n), tmp_path / "out").replace(os.sep, "/")
        for r, _d, ns in os.walk(tmp_path / "out")
        for n in ns
    ) == sorted([*FILES, "metadata.json"])
