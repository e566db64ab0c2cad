"""The manifest as a typed value (issue 43): one builder, one parser, one serialisation whose
bytes are those every earlier ckptstore wrote, for both format versions."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.checkpointing import CheckpointContext, amend, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.entries import FileEntry
from tests._helpers.trees import make_tree

_NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
# Files end in ".bin", folders do not: no file is also another entry's folder.
_FILE = st.lists(_NAME, min_size=1, max_size=3).map(lambda p: "/".join(p) + ".bin")
_FOLDER = _NAME.map(lambda n: f"{n}.d/")
_CRC = st.integers(0, 2**32 - 1).map("{:08x}".format)
_SHA = st.binary(min_size=32, max_size=32).map(bytes.hex)
_SIZE = st.integers(0, fmt.MAX_FILE_BYTES // 8)


@st.composite
def _entry(draw: st.DrawFn, chunked: bool) -> dict:
    crc = draw(_CRC)
    if not chunked or not draw(st.booleans()):
        return {"size": draw(_SIZE), "crc32c": crc}
    chunks = draw(st.lists(st.fixed_dictionaries({"sha256": _SHA, "size": _SIZE}), max_size=4))
    return {"size": sum(c["size"] for c in chunks), "crc32c": crc, "blobs": chunks}


@st.composite
def _written(draw: st.DrawFn) -> tuple[str, fmt.Manifest]:
    """A manifest as a writer makes it: a commit (whole files, or chunks where the planner
    chose them), optionally a partial delete's rewrite of it."""
    uuid = draw(st.uuids()).hex
    chunked = draw(st.booleans())
    files = draw(st.dictionaries(_FILE, _entry(chunked), max_size=6))
    for folder in draw(st.lists(_FOLDER, max_size=2)):
        files[folder] = {"size": 0, "crc32c": fmt.EMPTY_CRC32C}
    metadata = json.dumps({"steps_completed": draw(st.integers(0, 10**6))}).encode()
    manifest = fmt.Manifest.build(uuid, files, metadata)
    if draw(st.booleans()):  # a partial delete keeps the version, marks it
        kept = {r: e for r, e in manifest.files.items() if draw(st.booleans())}
        manifest = manifest.with_files(kept, partially_deleted=True)
    return uuid, manifest


def _earlier_writer(manifest: fmt.Manifest) -> tuple[bytes, bytes]:
    """The bytes the dict-based writer wrote before the type existed (format 2 compact since
    14d0796), and the indented format 2 of the releases before that."""
    obj = {"format_version": manifest.version, "uuid": manifest.uuid}
    obj["files"] = {rel: entry.to_json() for rel, entry in manifest.files.items()}
    if manifest.partially_deleted:
        obj["partially_deleted"] = True
    indented = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
    if manifest.version == fmt.FORMAT_VERSION:
        return indented, indented
    compact = json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"
    return compact.encode(), indented


@settings(max_examples=100, deadline=None)
@given(_written())
def test_manifests_round_trip_with_the_bytes_every_version_wrote(written):
    uuid, manifest = written
    data = manifest.to_bytes()
    parsed = fmt.Manifest.parse(data, uuid)
    assert parsed == manifest and parsed.to_bytes() == data
    # The version is the writer's: chunks make format 2, and a reader agrees.
    assert manifest.version == (2 if manifest.deduplicated else 1) or manifest.partially_deleted
    assert parsed.deduplicated == any("blobs" in e for e in json.loads(data)["files"].values())
    current, older = _earlier_writer(manifest)
    assert data == current
    assert fmt.Manifest.parse(older, uuid) == manifest  # an indented format 2 still reads
    assert fmt.parse_manifest(data, uuid) == json.loads(data) == manifest.to_json()
    assert fmt.manifest_bytes(json.loads(data)) == data  # a script's JSON object, as is
    # File entries are frozen typed values read through the type, equal to their JSON.
    stored = json.loads(data)["files"]
    for rel, entry in parsed.files.items():
        assert isinstance(entry, FileEntry) and entry.to_json() == stored[rel]
        assert entry == FileEntry.of(stored[rel])
        assert entry.chunked == ("blobs" in stored[rel])
        assert [c.to_json() for c in entry.chunks or ()] == stored[rel].get("blobs", [])
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.size = 0  # type: ignore[misc]


def test_a_file_entry_keeps_keys_a_later_writer_adds():
    """An entry key this version does not know survives a rewrite (a partial delete)."""
    files = {
        "a.bin": {"size": 1, "crc32c": "0000000a", "later": {"x": [1, 2]}},
        "b.bin": {"size": 2, "crc32c": "0000000b"},
    }
    data = fmt.Manifest.build("u", files).to_bytes()
    manifest = fmt.Manifest.parse(data, "u")
    assert manifest.files["a.bin"].extra == (("later", {"x": [1, 2]}),)
    kept = manifest.with_files({"a.bin": manifest.files["a.bin"]}, partially_deleted=True)
    assert json.loads(kept.to_bytes())["files"] == {"a.bin": files["a.bin"]}
    with pytest.raises(TypeError):
        manifest.files["c.bin"] = manifest.files["b.bin"]  # type: ignore[index]


def _stored(ctx: CheckpointContext, uuid: str) -> fmt.Manifest:
    data = ctx.storage.read_bytes(f"{uuid}/{fmt.MANIFEST_NAME}")
    manifest = fmt.Manifest.parse(data, uuid)
    assert manifest.to_bytes() == data
    record = scan.record_from(manifest, ckpt_metadata.read_metadata(ctx.storage, uuid), "u")
    assert record.resources == manifest.sizes()
    return manifest


def test_stored_manifests_round_trip_through_commit_delete_and_amend(tmp_path):
    """What the writers put in storage (whole and deduplicated commits, a partial delete,
    an added file) parses to a value whose bytes are exactly the stored ones."""
    files = {"model.keras": os.urandom(3000), "opt/state.bin": b"s" * 700, "notes.txt": b"n"}
    src = make_tree(str(tmp_path / "src"), files)
    os.makedirs(os.path.join(src, "empty"))
    extra = make_tree(str(tmp_path / "extra"), {"added/x.txt": b"x"})
    for dedup in (False, True):
        with CheckpointContext(str(tmp_path / f"store-{dedup}"), dedup=dedup) as ctx:
            uuid = ctx.upload(src, {"steps_completed": 3})
            manifest = fmt.load_manifest(ctx.storage, uuid)
            assert (manifest.version, manifest.deduplicated) == ((2, True) if dedup else (1, False))
            assert set(manifest.files) == {*files, "empty/", fmt.METADATA_NAME}
            manifest = _stored(ctx, uuid)
            ctx.delete(uuid, globs=["notes.txt"])
            assert _stored(ctx, uuid).partially_deleted
            amend.add_files(ctx.storage, uuid, extra)
            manifest = _stored(ctx, uuid)
            assert manifest.partially_deleted and "added/x.txt" in manifest.files
            assert "notes.txt" not in manifest.files and manifest.version == (2 if dedup else 1)
