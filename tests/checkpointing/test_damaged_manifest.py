"""Damaged manifests never crash a reader: whatever a ``MANIFEST.json`` says, verify, download
and restore raise only typed ckptstore errors (the CLI exits 5), never a raw ``OSError``,
``OverflowError``, ``KeyError`` or ``MemoryError``.

The manifests are mutations of real ones written by ckptstore, whole-file (format 1) and
deduplicated (format 2), on local disk and the S3 emulator."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt
from ckptstore.cli.main import cli
from tests._helpers.trees import make_tree
from tests.checkpointing._helpers import write_manifest

FILES = {
    "model.keras": os.urandom(3 * 4096 + 5),
    "opt/state.bin": os.urandom(5000),
    "opt/deep/slots.bin": b"s" * 700,
    "notes.txt": b"hi",
}
SHA = "ab" * 32

#: Values a damaged manifest may hold where a size, checksum or list belongs.
WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**80), 2**80),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 2**70, fmt.MAX_FILE_BYTES + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["00000000", "ffffffff", SHA, "0" * 63, "G" * 8, ""]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
#: Relative paths, good and bad.
RELPATHS = st.one_of(
    st.sampled_from(
        ["model.keras/x", "opt", "opt/", "opt/deep", "notes.txt/", "a/", "../x", "/etc/passwd"]
    ),
    st.text(st.characters(codec="utf-8"), min_size=0, max_size=30),
    st.lists(st.sampled_from(["a", "b", "..", ".", "", "opt", "x" * 300]), max_size=4).map(
        "/".join
    ),
)


@st.composite
def mutation(draw: st.DrawFn, manifest: dict[str, Any]) -> Any:
    """A damaged copy of ``manifest`` (a dict), or damaged bytes."""
    damaged = copy.deepcopy(manifest)
    files = damaged["files"]
    names = sorted(files)
    kind = draw(
        st.sampled_from(
            ["field", "chunk", "add", "rename", "conflict", "drop", "top", "bytes", "blobs"]
        )
    )
    rel = draw(st.sampled_from(names))
    entry = files[rel]
    if kind == "field":
        entry[draw(st.sampled_from(["size", "crc32c", "blobs"]))] = draw(WEIRD)
    elif kind == "chunk" and entry.get("blobs"):
        chunk = draw(st.sampled_from(entry["blobs"]))
        chunk[draw(st.sampled_from(["size", "sha256"]))] = draw(WEIRD)
    elif kind == "blobs":
        entry["blobs"] = draw(
            st.lists(st.fixed_dictionaries({"sha256": st.just(SHA), "size": WEIRD}), max_size=3)
        )
    elif kind == "add":
        files[draw(RELPATHS)] = draw(st.one_of(st.just(copy.deepcopy(entry)), WEIRD))
    elif kind == "rename":
        files[draw(RELPATHS)] = files.pop(rel)
    elif kind == "conflict":
        other = draw(st.sampled_from([rel + "/x", rel + "/", rel.rsplit("/", 1)[0]]))
        files[other] = copy.deepcopy(entry)
    elif kind == "drop":
        entry.pop(draw(st.sampled_from(["size", "crc32c", "blobs"])), None)
    elif kind == "top":
        damaged[draw(st.sampled_from(["format_version", "uuid", "files"]))] = draw(WEIRD)
    elif kind == "bytes":
        data = fmt.manifest_bytes(manifest)
        cut = draw(st.integers(0, len(data)))
        tail = draw(st.sampled_from([b"", b"\xff", b"[" * 5000, b"9" * 5000, b"\x00"]))
        return data[:cut] + tail
    return damaged


def read_everything(ctx: CheckpointContext, url: str, uuid: str, out: str) -> None:
    """Every reader a user has; only ckptstore errors may come out (the CLI exits 0 or 5)."""
    try:
        ctx.download(uuid, out)
    except errors.CkptstoreError:
        pass
    try:
        with ctx.restore_path(uuid) as path:
            assert path.is_dir()
    except errors.CkptstoreError:
        pass
    try:
        scan.scan_checkpoints(ctx.storage)  # what reindex reads
    except errors.CkptstoreError:
        pass
    result = CliRunner().invoke(cli, ["--storage", url, "checkpoint", "verify", uuid])
    assert result.exit_code in (0, 5), (result.exit_code, result.output, result.exception)
    if result.exit_code == 5:
        name = result.output.split("Error: ", 1)[1].split(":", 1)[0]
        assert issubclass(
            getattr(errors, name), (errors.InvalidCheckpoint, errors.ChecksumMismatch)
        )


@pytest.mark.parametrize("dedup", [False, True], ids=["format1", "format2"])
def test_damaged_manifests_raise_only_typed_errors(local_and_s3_url, tmp_path, dedup):
    src = make_tree(str(tmp_path / "src"), FILES)
    os.makedirs(tmp_path / "src" / "empty")
    with CheckpointContext(local_and_s3_url, dedup=dedup, dedup_chunk_bytes=4096) as ctx:
        uuid = ctx.upload(src, {"steps_completed": 1})
        good = fmt.read_manifest(ctx.storage, uuid)
        assert good["format_version"] == (fmt.BLOBS_FORMAT_VERSION if dedup else 1)
        counter = iter(range(10**6))

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            write_manifest(ctx.storage, uuid, data.draw(mutation(good)))
            read_everything(ctx, local_and_s3_url, uuid, str(tmp_path / f"out{next(counter)}"))

        check()
        # The checkpoint itself was never touched: with its manifest back, it verifies.
        write_manifest(ctx.storage, uuid, fmt.manifest_bytes(good))
        ctx.download(uuid, tmp_path / "final")


def _entry(data: bytes = b"") -> dict[str, Any]:
    return {"size": len(data), "crc32c": ckpt_checksums.crc32c_bytes(data)}


def _chunked(size: int, *sizes: Any) -> dict[str, Any]:
    return {**_entry(b"x" * size), "blobs": [{"sha256": SHA, "size": s} for s in sizes]}


# Each: (format_version, files) that a reader must refuse, and words the message must hold.
BAD = {
    "prefix-conflict": (1, {"a": _entry(b"1"), "a/b": _entry(b"2")}, "both as a file"),
    "deep-prefix-conflict": (1, {"a/b": _entry(), "a/b/c/d": _entry()}, "both as a file"),
    "file-and-folder-entry": (1, {"a": _entry(), "a/": _entry()}, "both as a file"),
    "folder-with-size": (1, {"x/": {"size": 5, "crc32c": "00000000"}}, "folder entry"),
    "folder-with-crc": (1, {"x/": {"size": 0, "crc32c": "12345678"}}, "folder entry"),
    "folder-with-blobs": (2, {"x/": {**_entry(), "blobs": []}}, "folder entry"),
    "huge-size": (1, {"a": {"size": 2**70, "crc32c": "00000000"}}, "malformed entry"),
    "bool-size": (1, {"a": {"size": True, "crc32c": "00000000"}}, "malformed entry"),
    "float-size": (1, {"a": {"size": 1.0, "crc32c": "00000000"}}, "malformed entry"),
    "str-size": (1, {"a": {"size": "1", "crc32c": "00000000"}}, "malformed entry"),
    "upper-crc": (1, {"a": {"size": 1, "crc32c": "ABCDEF01"}}, "malformed entry"),
    "no-crc": (1, {"a": {"size": 1}}, "malformed entry"),
    "entry-not-dict": (1, {"a": [1, "00000000"]}, "malformed entry"),
    "blob-bad-sha": (
        2,
        {"a": {**_entry(b"x"), "blobs": [{"sha256": "AB" * 32, "size": 1}]}},
        "blob list",
    ),
    "blob-short-sha": (
        2,
        {"a": {**_entry(b"x"), "blobs": [{"sha256": "ab", "size": 1}]}},
        "blob list",
    ),
    "blob-bool-size": (2, {"a": _chunked(1, True)}, "blob list"),
    "blob-negative-size": (2, {"a": _chunked(1, 2, -1)}, "blob list"),
    "blob-huge-size": (2, {"a": _chunked(1, 2**70, 1 - 2**70)}, "blob list"),
    "blob-sum-differs": (2, {"a": _chunked(3, 1, 1)}, "blob list"),
    "blobs-not-list": (2, {"a": {**_entry(b"x"), "blobs": {"sha256": SHA}}}, "blob list"),
    "blobs-in-format-1": (1, {"a": _chunked(1, 1)}, "format_version=1"),
    "bad-relpath": (1, {"a/../../b": _entry()}, "Unsafe entry"),
    "nul-relpath": (1, {"a\x00b": _entry()}, "Unsafe entry"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_kind_of_damage_is_refused_as_invalid_checkpoint(name, tmp_path):
    version, files, words = BAD[name]
    data = json.dumps({"format_version": version, "uuid": "u1", "files": files}).encode()
    with pytest.raises(errors.InvalidCheckpoint, match=words) as caught:
        fmt.parse_manifest(data, "u1")
    assert "u1/MANIFEST.json" in str(caught.value)


@pytest.mark.parametrize(
    "data",
    [
        b'{"format_version": true, "files": {}}',
        b'{"format_version": 0, "files": {}}',
        b'{"format_version": 1.0, "files": {}}',
        b'{"format_version": 1, "files": {"a": {"size": 1' + b"0" * 5000 + b', "crc32c": "0"}}}',
        b"[" * 100_000,
        b'{"format_version": 1, "files": {"a": {"size": NaN, "crc32c": "00000000"}}}',
        b'{"format_version": 1, "files": {"a": {"size": Infinity, "crc32c": "00000000"}}}',
    ],
    ids=["bool-version", "zero-version", "float-version", "5000-digits", "deep", "nan", "inf"],
)
def test_odd_json_is_refused_as_invalid_checkpoint(data):
    with pytest.raises(errors.InvalidCheckpoint, match="u1/MANIFEST.json"):
        fmt.parse_manifest(data, "u1")


def test_manifest_over_the_size_cap_is_refused_before_parsing(monkeypatch):
    # Lowered so the test does not build 128 MiB; the check is on the byte count alone.
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", 1000)
    data = json.dumps({"format_version": 1, "files": {"a" * 2000: _entry()}}).encode()
    with pytest.raises(errors.InvalidCheckpoint, match="over the 1000-byte limit"):
        fmt.parse_manifest(data, "u1")
    with pytest.raises(errors.InvalidConfig, match="nothing was committed"):
        fmt.manifest_bytes({"format_version": 1, "files": {"a" * 2000: _entry()}})


def test_manifest_over_the_file_count_cap_is_refused(monkeypatch):
    monkeypatch.setattr(fmt, "MAX_MANIFEST_FILES", 3)
    files = {f"f{i}": _entry() for i in range(4)}
    data = json.dumps({"format_version": 1, "files": files}).encode()
    with pytest.raises(errors.InvalidCheckpoint, match="lists 4 files, over the limit of 3"):
        fmt.parse_manifest(data, "u1")


@pytest.mark.parametrize(
    "name", ["prefix-conflict", "folder-with-blobs", "huge-size", "bad-relpath"]
)
def test_cli_verify_and_download_exit_5_on_a_damaged_manifest(local_and_s3_url, tmp_path, name):
    version, files, words = BAD[name]
    with CheckpointContext(local_and_s3_url) as ctx:
        uuid = ctx.upload(make_tree(str(tmp_path / "src"), FILES))
        manifest = {"format_version": version, "uuid": uuid, "files": files}
        write_manifest(ctx.storage, uuid, manifest)
        for verb in (["verify", uuid], ["download", uuid, "-o", str(tmp_path / "out")]):
            result = CliRunner().invoke(cli, ["--storage", local_and_s3_url, "checkpoint", *verb])
            assert result.exit_code == 5, result.output
            assert words in result.output
        with pytest.raises(errors.InvalidCheckpoint, match=words):
            ctx.download(uuid, tmp_path / "out2")
        with pytest.raises(errors.InvalidCheckpoint, match=words):
            with ctx.restore_path(uuid):
                pass
        assert not fmt.is_committed(ctx.storage, uuid)


def test_a_writers_bad_name_stays_bad_input_in_a_folder_called_manifests(tmp_path):
    """Only a stored manifest's bad entry is damage (exit 5); saving a bad name is exit 2, even
    from a folder whose path says "manifest"."""
    src = tmp_path / "manifests" / "MANIFEST.json-like"
    make_tree(str(src), {"a\\b.bin": b"x"})
    with CheckpointContext(str(tmp_path / "store")) as ctx:
        with pytest.raises(errors.UnsafeCheckpointPath, match="Rename or remove") as caught:
            ctx.upload(str(src))
    assert not isinstance(caught.value, errors.UnsafeManifestEntry)
