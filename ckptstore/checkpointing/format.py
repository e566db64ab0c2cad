"""The on-storage checkpoint format: ``<prefix>/<uuid>/`` with ``metadata.json`` and, written
last and create-only, ``MANIFEST.json``.

The manifest lists every file of the checkpoint (relative path, size, crc32c). It is the commit:
a folder without a valid manifest is not a checkpoint, readers ignore it and GC removes it.

This module owns the folder layout (reserved names, the one path rule), a local folder's
manifest entries and their verification, the :class:`Manifest` type (its one parser and
serialisation) and a folder's commit slot (committed, deleted). Beside it: ``metadata.json`` in
:mod:`ckptstore.checkpointing.metadata`; what a storage holds (listing, records) in
:mod:`ckptstore.checkpointing.scan`.

Example::

    from ckptstore.checkpointing import format as ckpt_format
    from ckptstore.storage_backends import open_storage

    storage = open_storage("/tmp/ckpts")
    manifest = ckpt_format.load_manifest(storage, uuid)
    print(manifest.version, manifest.deduplicated, sorted(manifest.files))
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.blobs import SHA_RE, chunk_shas
from ckptstore.checkpointing.checksums import crc32c_bytes, crc32c_file, file_sums
from ckptstore.checkpointing.entries import FileEntry
from ckptstore.checkpointing.jsonfiles import load_json
from ckptstore.checkpointing.jsonfiles import refuse as _refuse
from ckptstore.storage_backends.paths import compile_selector as _compile_selector
from ckptstore.storage_backends.paths import key_problem
from ckptstore.validators import is_int

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

MANIFEST_NAME = "MANIFEST.json"
METADATA_NAME = "metadata.json"
#: Written first by a remote upload, removed after the commit; its timestamp dates leftovers.
PENDING_MARKER_NAME = ".ckptstore-pending.json"
#: Local staging folders beside the final one are named ``<STAGING_PREFIX><uuid>``.
STAGING_PREFIX = ".ckptstore-staging-"
#: Names inside a checkpoint folder that ckptstore writes itself.
RESERVED_NAMES = frozenset({MANIFEST_NAME, METADATA_NAME, PENDING_MARKER_NAME})
FORMAT_VERSION = 1
#: Manifests naming the content of some files as content-addressed blobs
#: (:mod:`ckptstore.checkpointing.blobs`); whole-file checkpoints keep ``FORMAT_VERSION``.
BLOBS_FORMAT_VERSION = 2

#: What a reader accepts from a ``MANIFEST.json``, checked before anything acts on it. Far
#: beyond what ckptstore writes (a format 2 manifest of a 1 TB model in 4 MiB chunks is ~25 MB
#: with ~260,000 chunks); a manifest past them was damaged or forged, and is refused before it
#: can make a reader parse gigabytes of JSON or create a file of 2**70 bytes.
MAX_MANIFEST_BYTES = 128 * 2**20
MAX_MANIFEST_FILES = 1_000_000
#: 1 PiB: the largest file (and chunk) size a manifest may state.
MAX_FILE_BYTES = 2**50
#: The folder of a checkpoint's inference SavedModel (``model.export()``; the one definition).
SAVED_MODEL_DIRNAME = "saved_model"
#: Folders a deduplicated checkpoint on a store with a local path stores whole, in the
#: checkpoint folder, so they can be opened in place: see :func:`kept_whole_in_place`.
IN_PLACE_FOLDERS = (SAVED_MODEL_DIRNAME + "/",)
#: What GC and deletes put in a folder's commit slot (``MANIFEST.json``) before they remove
#: its files, and leave there: readers take the folder for "not a checkpoint", and a writer
#: that wakes up late finds the slot taken (its create-only manifest write and any
#: conditional rewrite fail), so it never commits into a folder whose bytes are gone.
TOMBSTONE_MANIFEST = b'{"ckptstore_removed": true}\n'
#: The crc32c of no bytes: what a folder entry (``"x/"``) carries.
EMPTY_CRC32C = crc32c_bytes(b"")

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CRC_RE = re.compile(r"^[0-9a-f]{8}$")


# ---- ids and paths -----------------------------------------------------------------------------
def check_storage_id(storage_id: str) -> str:
    """Return ``storage_id`` if it is a safe single folder name, else raise InvalidConfig."""
    if not isinstance(storage_id, str) or not _ID_RE.match(storage_id) or ".." in storage_id:
        raise errors.InvalidConfig(
            "A checkpoint storage_id must be one folder name such as a UUID (letters, digits, "
            f"'.', '_', '-'). Received: storage_id={storage_id!r}"
        )
    return storage_id


def check_entry(relpath: str, *, where: str = "manifest") -> str:
    """The one rule for a file path inside a checkpoint, used by every writer (on each file,
    before anything is committed) and by the reader (on each manifest entry): the storage key
    rule of :func:`~ckptstore.storage_backends.paths.check_key` (a trailing ``/`` marks an
    empty folder). Raises :class:`~ckptstore.errors.UnsafeCheckpointPath` naming the entry;
    ``where`` names the folder being saved, or the manifest being read."""
    if not isinstance(relpath, str) or not relpath:
        why: str | None = f"an entry must be a non-empty str, got {relpath!r}"
    else:
        why = key_problem(relpath[:-1] if relpath.endswith("/") else relpath, allow_empty=False)
        top = relpath.split("/", 1)[0]
        if why is None and "/" in relpath and top in RESERVED_NAMES:
            # A folder named like a file ckptstore writes beside the user's files (metadata.json,
            # MANIFEST.json, the pending marker) would collide with it in the checkpoint folder.
            why = f"{top!r} is a file name ckptstore writes itself, so it cannot be a folder"
    if why is None:
        return relpath
    # Exact, not "manifest" in where: a folder being saved may be called "manifests/".
    reading = where == "manifest" or where.endswith(MANIFEST_NAME)
    if reading:
        todo = (
            "Do not load this checkpoint: it was not written by ckptstore or was altered; "
            "re-save it with ckptstore."
        )
    else:
        todo = (
            "Rename or remove that file before saving (names must be relative paths inside the "
            "checkpoint folder, valid UTF-8, without control characters, backslashes or "
            "'..'); nothing was committed."
        )
    # A stored manifest's bad entry is damage (CLI exit 5); a writer's bad name is bad input.
    cls = errors.UnsafeManifestEntry if reading else errors.UnsafeCheckpointPath
    raise cls(f"Unsafe entry {relpath!r} in the checkpoint {where}: {why}. {todo}")


def compile_selector(selector: Any) -> Callable[[str], bool]:
    """A predicate from a selector: None (all), a callable, one glob, or several globs
    (the same rules as the storage backends: ``*`` crosses ``/``, a folder name selects its
    contents)."""
    try:
        return _compile_selector(selector)
    except errors.InvalidStoragePath as exc:
        raise errors.InvalidConfig(str(exc)) from None


# ---- local trees -------------------------------------------------------------------------------
def local_files(local_dir: str, *, skip_reserved: bool = True) -> dict[str, str]:
    """``{relpath: absolute path}`` of every file under ``local_dir``; empty folders appear as
    ``"dir/"`` entries. Top-level reserved names are skipped (with a log line) by default."""
    if not os.path.isdir(local_dir):
        raise errors.InvalidConfig(
            f"Checkpoint folder {local_dir!r} does not exist or is not a folder; pass the "
            "folder your checkpoint files were written to."
        )
    found: dict[str, str] = {}
    for root, dirs, files in os.walk(local_dir):
        dirs.sort()
        rel_root = os.path.relpath(root, local_dir).replace(os.sep, "/")
        prefix = "" if rel_root == "." else rel_root + "/"
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise errors.InvalidConfig(
                    f"{prefix + name!r} in checkpoint folder {local_dir!r} is a symbolic link; "
                    "ckptstore does not follow links (they could point outside the folder). "
                    "Copy the file into the folder instead."
                )
        if prefix and not dirs and not files:
            found[prefix] = root
        if prefix and not dirs and not files:
            check_entry(prefix, where=f"folder {local_dir!r}")
        for name in sorted(files):
            rel = check_entry(prefix + name, where=f"folder {local_dir!r}")
            if skip_reserved and rel in RESERVED_NAMES:
                logger.warning(
                    "Skipping %s in %s: ckptstore writes that file itself.", rel, local_dir
                )
                continue
            found[rel] = os.path.join(root, name)
    return found


def build_manifest(local_dir: str, *, uuid: str | None = None) -> dict[str, Any]:
    """The manifest of every file under ``local_dir`` (``metadata.json`` included, the manifest
    itself excluded), as its JSON object: ``{"format_version", "uuid", "files": {relpath:
    {"size", "crc32c"}}}`` (:meth:`Manifest.build`)."""
    files: dict[str, dict[str, Any]] = {}
    for rel, path in local_files(local_dir, skip_reserved=False).items():
        if rel in (MANIFEST_NAME, PENDING_MARKER_NAME):
            continue
        files[rel] = _entry_for(rel, path)
    return Manifest.build(uuid, files).to_json()


def _entry_for(rel: str, path: str) -> dict[str, Any]:
    if rel.endswith("/"):
        return {"size": 0, "crc32c": EMPTY_CRC32C}
    return {"size": os.path.getsize(path), "crc32c": crc32c_file(path)}


def manifest_entries(
    files: Mapping[str, str],
    checksums: Mapping[str, str] | None = None,
    *,
    sha256: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Manifest entries for ``{relpath: absolute path}`` (see :func:`local_files`).

    ``checksums`` may give ``{relpath: crc32c}`` (8 hex digits) of files whose writer already
    computed it; those files are not read again for it (sizes are always taken from the file
    system). ``sha256``: a dict that receives every file's SHA-256 (a signature's digests),
    computed in the same read as its crc32c (one read for it alone where the crc32c is known).
    """
    known = check_checksums(checksums)
    entries: dict[str, dict[str, Any]] = {}
    for rel, path in files.items():
        if rel.endswith("/"):
            entries[rel] = {"size": 0, "crc32c": EMPTY_CRC32C}
            continue
        crc = known.get(rel)
        size = os.path.getsize(path)
        if crc is None or sha256 is not None:
            read_crc, sha = file_sums(path, crc32c=crc is None, sha256=sha256 is not None)
            crc = crc or read_crc
            if sha256 is not None:
                sha256[rel] = str(sha)
        entries[rel] = {"size": size, "crc32c": crc}
    return entries


def check_checksums(checksums: Mapping[str, str] | None) -> dict[str, str]:
    """Validate caller-computed ``{relpath: crc32c}`` (8 lowercase hex digits each)."""
    if checksums is None:
        return {}
    if not isinstance(checksums, Mapping):
        raise errors.InvalidConfig(
            "checksums must be a dict {relative path: crc32c as 8 hex digits}. Received: "
            f"{type(checksums).__name__}"
        )
    for rel, crc in checksums.items():
        if not isinstance(crc, str) or _CRC_RE.match(crc) is None:
            raise errors.InvalidConfig(
                f"checksums[{rel!r}] must be a crc32c as 8 lowercase hex digits (e.g. "
                f"'0a1b2c3d'). Received: {crc!r}"
            )
    return dict(checksums)


# ---- JSON bytes ------------------------------------------------------------------------------
def dump_json(obj: Mapping[str, Any]) -> bytes:
    """Stable, readable JSON bytes for manifests and metadata (strict JSON: NaN/inf were made
    ``null`` by :func:`ckptstore.jsonsafe.to_json` before)."""
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def manifest_bytes(manifest: Manifest | Mapping[str, Any]) -> bytes:
    """``MANIFEST.json`` bytes of a :class:`Manifest`, or of a JSON object as it is (a
    script's, even a damaged one): :meth:`Manifest.to_bytes`."""
    if isinstance(manifest, Manifest):
        return manifest.to_bytes()
    return _manifest_json_bytes(manifest, manifest.get("format_version"), len(manifest["files"]))


def verify_files(
    local_dir: str,
    manifest: Manifest | Mapping[str, Any],
    selector: Any = None,
    *,
    sha256: dict[str, str] | None = None,
    check: bool = True,
) -> dict[str, int]:
    """Check size and crc32c of every manifest file the selector picks under ``local_dir``.

    Returns ``{relpath: size}`` of what was checked; raises :class:`ChecksumMismatch` naming
    the first file that is missing or differs. ``sha256``: a dict that receives each file's
    SHA-256, computed in the same read as its crc32c (what a signature is compared with).
    ``check=False`` skips the size and crc32c comparison (only ``sha256`` is filled in).
    """
    select = compile_selector(selector)
    checked: dict[str, int] = {}
    for rel, entry in Manifest.of(manifest).files.items():
        if not select(rel):
            continue
        path = os.path.join(local_dir, *rel.rstrip("/").split("/"))
        if rel.endswith("/"):
            os.makedirs(path, exist_ok=True)
            continue
        if not os.path.isfile(path):
            raise errors.ChecksumMismatch(
                f"File {rel!r} listed in the checkpoint manifest is missing from {local_dir!r}; "
                "the download was incomplete or the checkpoint was damaged. Retry the download."
            )
        size = os.path.getsize(path)
        if check and size != entry.size:
            raise errors.ChecksumMismatch(
                f"File {rel!r} has {size} bytes but the checkpoint manifest says "
                f"{entry.size}; the copy is damaged. Retry the download, or pass "
                "verify=False to skip verification at your own risk."
            )
        crc, sha = (
            file_sums(path, crc32c=check, sha256=sha256 is not None)
            if check or sha256 is not None
            else (None, None)
        )
        if sha256 is not None:
            sha256[rel] = str(sha)
        if check and crc != entry.crc32c:
            raise errors.ChecksumMismatch(
                f"File {rel!r} has crc32c {crc} but the checkpoint manifest says "
                f"{entry.crc32c}; the copy is damaged. Retry the download, or pass "
                "verify=False to skip verification at your own risk."
            )
        checked[rel] = size
    return checked


def kept_whole_in_place(storage: Storage, uuid: str) -> Callable[[str], bool]:
    """Which files of checkpoint ``uuid`` a deduplicated (format 2) commit stores whole in the
    checkpoint folder rather than as chunks: on a store with a local path (local disk,
    Determined's ``shared_fs``), those under :data:`IN_PLACE_FOLDERS`; elsewhere none.

    Why: TF Serving, ``tf.saved_model.load`` and batch jobs point at
    ``<store>/<uuid>/saved_model`` in place, and a folder of chunks cannot be served. A
    SavedModel is written once per run by default (the final export), so storing it whole
    costs little; everything else (``model.keras``, optimizer state) is deduplicated. On
    object stores nothing is read in place (a download assembles files), so it is chunked.
    The one owner of this rule: commits, sharded commits and ``amend`` (exports) plan with it."""
    if storage.local_path(uuid) is None:
        return lambda rel: False
    return lambda rel: rel.startswith(IN_PLACE_FOLDERS)


# ---- the manifest -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Manifest:
    """A ``MANIFEST.json`` as a value: every reader gets it from :meth:`parse` (which checks
    it), every writer from :meth:`build`; :meth:`to_bytes` is its one serialisation (JSON
    bytes unchanged for every format version).

    ``files``: ``{relpath: FileEntry}``, read-only (:class:`.entries.FileEntry`: size,
    crc32c, and the chunks of a file stored as chunks). ``version``: chosen by the writer when built (2 when some file is
    stored as chunks, else 1); a parsed manifest keeps the one it was written with.
    ``extra``: other top-level keys, kept as read so a rewrite carries them."""

    uuid: str | None
    files: Mapping[str, FileEntry]
    version: int = FORMAT_VERSION
    partially_deleted: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.files, MappingProxyType):
            files = {rel: FileEntry.of(e) for rel, e in sorted(self.files.items())}
            object.__setattr__(self, "files", MappingProxyType(files))

    @classmethod
    def build(cls, uuid: str | None, entries: Mapping[str, Any], metadata: bytes = b"") -> Manifest:
        """The one builder: a manifest of ``entries`` (plus ``metadata.json`` when its bytes
        are given), format 2 when an entry names chunks, else format 1. ``entries``:
        :class:`FileEntry` values or a writer's entries in their JSON shape."""
        files = {rel: FileEntry.of(entry) for rel, entry in entries.items()}
        if metadata:
            files[METADATA_NAME] = FileEntry(len(metadata), crc32c_bytes(metadata))
        chunked = any(e.chunked for e in files.values())
        return cls(uuid, files, BLOBS_FORMAT_VERSION if chunked else FORMAT_VERSION)

    def with_files(self, files: Mapping[str, Any], **changes: Any) -> Manifest:
        """This manifest listing ``files`` instead (``changes``: other fields that change)."""
        return replace(self, files=files, **changes)

    @classmethod
    def of(cls, manifest: Manifest | Mapping[str, Any]) -> Manifest:
        """``manifest`` itself, or the manifest its JSON object (:meth:`to_json`) describes,
        unchecked (the compatibility path of :func:`read_manifest`'s callers)."""
        if isinstance(manifest, Manifest):
            return manifest
        rest = {k: v for k, v in manifest.items() if k not in _MANIFEST_KEYS}
        version, deleted = manifest.get("format_version", 1), manifest.get("partially_deleted")
        return cls(manifest.get("uuid"), manifest["files"], version, bool(deleted), rest)

    @classmethod
    def parse(cls, data: bytes, uuid: str) -> Manifest:
        """Parse and validate manifest bytes: the one check every reader of a
        ``MANIFEST.json`` goes through, so that what download, verify, restore, GC and the UI
        act on is well formed. Raises :class:`~ckptstore.errors.InvalidCheckpoint` naming
        what is wrong (an unsafe path: :class:`~ckptstore.errors.UnsafeManifestEntry`)."""
        where = f"{uuid}/{MANIFEST_NAME}"
        if data == TOMBSTONE_MANIFEST:
            raise errors.CheckpointDeleted(
                f"Checkpoint {uuid} was deleted ({where} holds the tombstone GC and deletes "
                "leave); it is not a checkpoint. Use another checkpoint UUID."
            )
        manifest = load_json(data, where, MAX_MANIFEST_BYTES)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise _refuse(where, "has no 'files' mapping")
        version = manifest.get("format_version")
        if not is_int(version) or not FORMAT_VERSION <= version <= BLOBS_FORMAT_VERSION:
            raise errors.InvalidCheckpoint(
                f"{where} has format_version={version!r}; this ckptstore reads versions "
                f"{FORMAT_VERSION} to {BLOBS_FORMAT_VERSION}. Upgrade ckptstore to read a "
                "newer one."
            )
        if manifest.get("uuid") not in (None, uuid):
            raise errors.InvalidCheckpoint(
                f"{where} names checkpoint {manifest.get('uuid')!r}, not {uuid!r}; the folder "
                "was copied or renamed. Copy checkpoints with their folder name unchanged."
            )
        files = manifest["files"]
        if len(files) > MAX_MANIFEST_FILES:
            raise _refuse(
                where, f"lists {len(files)} files, over the limit of {MAX_MANIFEST_FILES}"
            )
        for rel, entry in files.items():
            check_entry(rel, where=where)
            _check_file_entry(entry, rel, version, where)
        _check_no_prefix_conflict(files, where)
        return cls.of(manifest)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``MANIFEST.json`` (a new dict; its entries are this manifest's)."""
        files = {rel: entry.to_json() for rel, entry in self.files.items()}
        out = {"format_version": self.version, "uuid": self.uuid, "files": files}
        if self.partially_deleted:
            out["partially_deleted"] = True
        out.update(self.extra)
        return out

    def to_bytes(self) -> bytes:
        """``MANIFEST.json`` bytes: indented like metadata, except format 2, which lists every
        chunk and is uploaded with every checkpoint: one compact line (a third smaller)."""
        return _manifest_json_bytes(self.to_json(), self.version, len(self.files))

    @cached_property
    def deduplicated(self) -> bool:
        """True when some file is stored as content-addressed chunks."""
        return any(e.chunked for e in self.files.values())

    @staticmethod
    def may_be_deduplicated(data: bytes) -> bool:
        """A cheap look at bytes before parsing: False if they surely name no chunk."""
        return b'"blobs"' in data

    def sizes(self) -> dict[str, int]:
        """``{relpath: size}`` of every listed file."""
        return {rel: entry.size for rel, entry in self.files.items()}

    def blobs(self) -> set[str]:
        """The SHA-256 of every chunk the manifest names."""
        return chunk_shas(self.files)


def _manifest_json_bytes(obj: Mapping[str, Any], version: object, count: int) -> bytes:
    if version == BLOBS_FORMAT_VERSION:
        compact = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
        data = (compact + "\n").encode()
    else:
        data = dump_json(obj)
    # Never commit a manifest that readers would refuse as damaged.
    if len(data) > MAX_MANIFEST_BYTES or count > MAX_MANIFEST_FILES:
        raise errors.InvalidConfig(
            f"This checkpoint's manifest would list {count} files in {len(data)} bytes, over "
            f"the limits of {MAX_MANIFEST_FILES} files and {MAX_MANIFEST_BYTES} bytes; nothing "
            "was committed. Save fewer, larger files (or a larger dedup_chunk_bytes). "
            f"Received: {count} files, {len(data)} bytes"
        )
    return data


_MANIFEST_KEYS = frozenset({"format_version", "uuid", "files", "partially_deleted"})


def parse_manifest(data: bytes, uuid: str) -> dict[str, Any]:
    """The JSON object of checked manifest bytes (:meth:`Manifest.parse`), for scripts."""
    return Manifest.parse(data, uuid).to_json()


def _is_size(value: object) -> bool:
    # Parsed JSON holds plain ints: `type is int` refuses bools (a subclass) and floats (1.0,
    # NaN) at the cost of one comparison, on the hundreds of thousands of chunks of a manifest.
    return type(value) is int and 0 <= value <= MAX_FILE_BYTES


def _check_file_entry(entry: object, rel: str, version: int, where: str) -> None:
    """One ``files`` entry: ``{"size", "crc32c"}`` plus, in format 2, ``blobs`` (chunks with
    ``sha256`` and ``size`` adding up to the file's size). A folder entry (``"x/"``) is empty."""
    ok = (
        isinstance(entry, dict)
        and _is_size(entry.get("size"))
        and isinstance(entry.get("crc32c"), str)
        and _CRC_RE.match(entry["crc32c"]) is not None
    )
    if not ok:
        raise _refuse(
            where,
            f"has a malformed entry for {rel!r}: {str(entry)[:200]} (expected an int size "
            f"from 0 to {MAX_FILE_BYTES} and a crc32c of 8 lowercase hex digits)",
        )
    assert isinstance(entry, dict)
    if rel.endswith("/"):
        if entry["size"] != 0 or entry["crc32c"] != EMPTY_CRC32C or "blobs" in entry:
            raise _refuse(
                where,
                f"has folder entry {rel!r} with content: {str(entry)[:200]} (a folder "
                f"entry has size 0, crc32c {EMPTY_CRC32C} and no blobs)",
            )
        return
    if "blobs" not in entry:
        return
    if version < BLOBS_FORMAT_VERSION:
        raise _refuse(where, f"lists blobs for {rel!r} but has format_version={version}")
    chunks = entry["blobs"]
    ok = isinstance(chunks, list) and all(
        isinstance(c, dict)
        and isinstance(c.get("sha256"), str)
        and SHA_RE.match(c["sha256"]) is not None
        and _is_size(c.get("size"))
        for c in chunks
    )
    if not ok or sum(c["size"] for c in chunks) != entry["size"]:
        raise _refuse(
            where,
            f"has a malformed blob list for {rel!r} (expected chunks with a sha256 of 64 "
            "lowercase hex digits and an int size, adding up to the file size "
            f"{entry['size']})",
        )


def _check_no_prefix_conflict(files: Mapping[str, Any], where: str) -> None:
    """Refuse a file that is also another entry's folder (``a`` beside ``a/b`` or ``a/``):
    no file system can hold both, and a download would fail half-way with an OSError."""
    folders: set[str] = set()
    for rel in files:
        # A folder entry "a/b/" is the folder "a/b" itself (and "a"); a file "a/b/c" is in them.
        end = len(rel) - 1 if rel.endswith("/") else rel.rfind("/")
        while end > 0 and rel[:end] not in folders:  # a known folder's parents are known too
            folders.add(rel[:end])
            end = rel.rfind("/", 0, end)
    both = sorted(folders.intersection(rel for rel in files if not rel.endswith("/")))
    if both:
        inside = min(rel for rel in files if rel.startswith(both[0] + "/"))
        raise _refuse(where, f"lists {both[0]!r} both as a file and as the folder of {inside!r}")


def read_manifest(storage: Storage, uuid: str) -> dict[str, Any]:
    """The JSON object of :func:`load_manifest`, for scripts."""
    return load_manifest(storage, uuid).to_json()


def load_manifest(storage: Storage, uuid: str) -> Manifest:
    """The validated manifest of checkpoint ``uuid``; InvalidCheckpoint if missing or bad."""
    return load_manifest_and_bytes(storage, uuid)[0]


def load_manifest_and_bytes(storage: Storage, uuid: str) -> tuple[Manifest, bytes]:
    """:func:`load_manifest` and the bytes it was parsed from (what a conditional rewrite of
    the manifest must find still there)."""
    check_storage_id(uuid)
    try:
        data = storage.read_bytes(f"{uuid}/{MANIFEST_NAME}")
    except errors.StorageNotFound:
        raise errors.InvalidCheckpoint(
            f"{uuid}/{MANIFEST_NAME} does not exist in {storage.url}: checkpoint {uuid} was "
            "never committed (or is being written). Use a committed checkpoint UUID."
        ) from None
    return Manifest.parse(data, uuid), data


# ---- a folder's commit slot -----------------------------------------------------------------
def is_committed(storage: Storage, uuid: str) -> bool:
    """True if ``uuid`` has a valid manifest (a committed checkpoint)."""
    try:
        load_manifest(storage, uuid)
    except errors.InvalidCheckpoint:
        return False
    return True


def holds_commit(storage: Storage, uuid: str) -> bool:
    """True if ``uuid``'s commit slot holds a manifest (valid or not), not nothing and not
    the :data:`TOMBSTONE_MANIFEST` of a deleted checkpoint."""
    try:
        return storage.read_bytes(f"{uuid}/{MANIFEST_NAME}") != TOMBSTONE_MANIFEST
    except errors.StorageNotFound:
        return False


def is_removed(storage: Storage, name: str) -> bool:
    """True if folder ``name`` holds nothing but the tombstone of a deleted checkpoint."""
    listed = storage.list(name)
    if set(listed) != {MANIFEST_NAME} or listed[MANIFEST_NAME] != len(TOMBSTONE_MANIFEST):
        return False
    return not holds_commit(storage, name)


def is_checkpoint_name(name: str) -> bool:
    """True if ``name`` could be a checkpoint folder (not a staging or hidden folder)."""
    return bool(_ID_RE.match(name)) and ".." not in name
