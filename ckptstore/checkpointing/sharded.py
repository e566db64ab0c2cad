"""Sharded checkpoints: every rank uploads its own files into one checkpoint.

The chief picks the UUID, writes the pending marker and broadcasts the UUID; the ranks exchange
their file lists (two ranks writing the same path is a :class:`CheckpointConflict` on every
rank) and metadata (merged; a key with different values is a conflict); each rank uploads its
files; the chief writes ``metadata.json`` and the manifest once every rank has finished. Each
phase ends with an allgather of every rank's status, so all ranks fail together instead of
hanging.

Example::

    uuid = agree_on_uuid(storage, dist)
    commit_sharded(storage, dist, uuid, "/tmp/my-shard", {"steps_completed": 5}, ...)
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid as _uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import blobs, commit, condemned, signing
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.distributed import ProcessGroup
from ckptstore.checkpointing.index import CheckpointIndex

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)


def _all_ok(dist: ProcessGroup, error: BaseException | None, payload: Any = None) -> list[Any]:
    """Allgather ``payload`` or an error; raise on every rank if any rank failed."""
    mine = {"error": f"{type(error).__name__}: {error}"} if error is not None else {"ok": payload}
    statuses = dist.allgather(mine)
    failed = [(rank, s["error"]) for rank, s in enumerate(statuses) if "error" in s]
    if failed:
        if error is not None:
            raise error
        rank, message = failed[0]
        raise errors.CheckpointError(
            f"Sharded checkpoint failed on rank {rank}: {message}. See that rank's log."
        )
    return [s["ok"] for s in statuses]


def agree_on_uuid(storage: Storage, dist: ProcessGroup) -> str:
    """The chief's new checkpoint UUID on every rank (after the chief wrote the marker)."""
    error = None
    uuid = None
    if dist.rank == 0:
        uuid = str(_uuid.uuid4())
        try:
            commit.write_pending_marker(storage, uuid)
        except Exception as exc:
            error = exc
    status = dist.broadcast({"uuid": uuid, "error": None if error is None else str(error)})
    if status["error"] is not None:
        if error is not None:
            raise error
        raise errors.CheckpointError(
            f"The chief could not start a sharded checkpoint: {status['error']}"
        )
    return status["uuid"]


def merge_metadata(per_rank: list[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Merge the ranks' metadata dicts (nested dicts recursively). The same key with different
    values on two ranks raises :class:`CheckpointConflict`."""
    merged: dict[str, Any] = {}
    owner: dict[str, int] = {}

    def merge(into: dict[str, Any], new: Mapping[str, Any], rank: int, path: str) -> None:
        for key, value in new.items():
            where = f"{path}{key}"
            if key not in into:
                into[key] = value
                owner[where] = rank
            elif isinstance(into[key], dict) and isinstance(value, dict):
                merge(into[key], value, rank, where + ".")
            elif into[key] != value:
                raise errors.CheckpointConflict(
                    f"Sharded checkpoint metadata key {where!r} is {into[key]!r} on rank "
                    f"{owner.get(where, 0)} but {value!r} on rank {rank}; give it the same "
                    "value on every rank or set it on one rank only."
                )

    for rank, metadata in enumerate(per_rank):
        merge(merged, metadata or {}, rank, "")
    return merged


def check_conflicts(per_rank_paths: list[list[str]]) -> None:
    """Raise :class:`CheckpointConflict` if two ranks have a file at the same path."""
    seen: dict[str, int] = {}
    for rank, paths in enumerate(per_rank_paths):
        for path in paths:
            if path.endswith("/"):
                continue  # empty folders may exist on several ranks
            if path in seen:
                raise errors.CheckpointConflict(
                    f"Ranks {seen[path]} and {rank} both wrote {path!r} to one sharded "
                    "checkpoint; each rank must write different files (e.g. put the rank in "
                    "the file name)."
                )
            seen[path] = rank


def commit_sharded(
    storage: Storage,
    dist: ProcessGroup,
    uuid: str,
    local_dir: str,
    user_metadata: Mapping[str, Any] | None,
    *,
    build_metadata: Callable[[str, Mapping[str, Any]], dict[str, Any]],
    index: CheckpointIndex | None = None,
    storage_url: str | None = None,
    dedup_chunk_bytes: int | None = None,
    signing_key: signing.KeyPath | None = None,
) -> str:
    """Upload this rank's files of ``local_dir`` into checkpoint ``uuid``; every rank calls it.
    ``build_metadata(uuid, merged_user_metadata)`` makes the final metadata on the chief.

    With ``signing_key`` (given on the chief; the other ranks only need to know one is set)
    each rank computes its files' SHA-256 in the read that checksums them and sends them
    with its file list; the chief signs every rank's logical files and commits ``model.sig``
    with the manifest, so the checkpoint verifies like a single writer's.

    With ``dedup_chunk_bytes`` the files are stored as content-addressed chunks (format 2), by
    the same protocol as a single writer's commit: the chief's pending marker names the blobs
    of *every* rank before any rank reads GC's condemnations, so a sweep keeps them all (one
    marker per checkpoint is what GC reads), and each rank stores whole the files a running
    sweep threatens."""
    url = storage_url or storage.url
    prepared = None
    planned: dict[str, dict[str, Any]] = {}
    error: BaseException | None = None
    # Taken before the chief can write the marker (it waits for this allgather): each rank's
    # bound on how long ago the marker was written, as a single writer's marker start is.
    before_marker = condemned._monotonic()
    try:
        prepared = commit.PreparedFiles(local_dir, sha256=signing_key is not None)
        if dedup_chunk_bytes is not None:
            whole = fmt.kept_whole_in_place(storage, uuid)
            planned = blobs.plan(local_dir, prepared.entries, dedup_chunk_bytes, whole=whole)
    except Exception as exc:
        error = exc
    listing = _all_ok(
        dist,
        error,
        {
            "paths": list(prepared.entries) if prepared else [],
            "metadata": dict(user_metadata or {}),
            "blobs": sorted(blobs.chunk_shas(planned)),
            "sha256": prepared.sha256 if prepared else {},
        },
    )
    check_conflicts([item["paths"] for item in listing])
    merged_user = merge_metadata([item["metadata"] for item in listing])
    with contextlib.ExitStack() as chief_marker:
        metadata = None
        marker: commit.PendingMarker | commit.MarkerSeen | None = None
        error = None
        if dist.rank == 0:
            # Refused metadata (the JSON policy, a bad steps_completed) must stop every rank
            # before anything is uploaded, not leave the other ranks waiting.
            try:
                metadata = build_metadata(uuid, merged_user)
                commit.record_pending(index, uuid, metadata, url)
                if dedup_chunk_bytes is not None:
                    every_blob = [sha for item in listing for sha in item["blobs"]]
                    marker = chief_marker.enter_context(
                        commit.PendingMarker(storage, uuid, every_blob)
                    )
            except Exception as exc:
                error = exc
        _all_ok(dist, error)
        if dedup_chunk_bytes is not None and marker is None:
            marker = commit.MarkerSeen(f"{uuid}/{fmt.PENDING_MARKER_NAME}", before_marker)
        stored = _upload_rank(storage, dist, uuid, prepared, planned, dedup_chunk_bytes, marker)
        error = None
        manifest = fmt.Manifest(uuid, {})
        if dist.rank == 0:
            try:
                assert metadata is not None
                if signing_key is not None:
                    stored.update(_store_signature(storage, uuid, listing, signing_key))
                manifest = _write_commit(storage, uuid, stored, metadata, marker)
            except Exception as exc:
                error = exc
    if dist.rank == 0 and error is None:
        try:
            commit.remove_pending_marker(storage, uuid)
            commit.record_committed(index, manifest, metadata, url)
            logger.info(
                "Committed sharded checkpoint %s from %d ranks to %s", uuid, dist.size, storage.url
            )
        except Exception as exc:
            error = exc
    _all_ok(dist, error)
    return uuid


def _upload_rank(
    storage: Storage,
    dist: ProcessGroup,
    uuid: str,
    prepared: commit.PreparedFiles | None,
    planned: dict[str, dict[str, Any]],
    chunk_bytes: int | None,
    marker: commit.PendingMarker | commit.MarkerSeen | None,
) -> dict[str, Any]:
    """Upload this rank's files (whole, or as blobs under ``marker``); every rank's stored
    entries, merged (the chief needs them all for the manifest)."""
    error: BaseException | None = None
    entries: dict[str, Any] = {}
    try:
        assert prepared is not None
        if chunk_bytes is None:
            prepared.upload_to(storage, uuid)
            entries = prepared.entries
        else:
            assert marker is not None
            entries, _stats = commit.upload_entries(
                storage, uuid, prepared.local_dir, planned, chunk_bytes, marker
            )
    except Exception as exc:
        error = exc
    merged: dict[str, Any] = {}
    for rank_entries in _all_ok(dist, error, entries):
        merged.update(rank_entries)
    return merged


def _store_signature(
    storage: Storage, uuid: str, listing: list[dict[str, Any]], signing_key: signing.KeyPath
) -> dict[str, Any]:
    """The chief signs every rank's files (their digests came with ``listing``) and writes
    ``model.sig`` whole (also in a deduplicated checkpoint: a format-2 entry without blobs);
    returns its entry."""
    covered: dict[str, str] = {}
    for rank, item in enumerate(listing):
        unhashed = [p for p in signing.signed_names(item["paths"]) if p not in item["sha256"]]
        if unhashed:
            raise errors.InvalidConfig(
                f"The chief signs this sharded checkpoint but rank {rank} has no signing key, "
                f"so it did not hash its files ({unhashed[:3]}); set {signing.SIGNING_KEY_ENV} "
                f"(or signing_key=) on every rank. Received: rank {rank} without a key."
            )
        covered.update((p, item["sha256"][p]) for p in signing.signed_names(item["paths"]))
    with tempfile.TemporaryDirectory(prefix="ckptstore-sign-") as tmp:
        out = os.path.join(tmp, signing.SIGNATURE_NAME)
        signing.sign_digests(covered, signing_key, out, name=uuid)
        with open(out, "rb") as f:
            data = f.read()
    storage.write_bytes(f"{uuid}/{signing.SIGNATURE_NAME}", data)
    return {
        signing.SIGNATURE_NAME: {"size": len(data), "crc32c": ckpt_checksums.crc32c_bytes(data)}
    }


def _write_commit(
    storage: Storage,
    uuid: str,
    entries: Mapping[str, Any],
    metadata: Mapping[str, Any],
    marker: commit.PendingMarker | commit.MarkerSeen | None,
) -> fmt.Manifest:
    """The chief's commit: ``metadata.json``, then (marker still live) the manifest."""
    meta_bytes = commit.fmt.dump_json(metadata)
    manifest = fmt.Manifest.build(uuid, entries, meta_bytes)
    storage.write_bytes(f"{uuid}/{fmt.METADATA_NAME}", meta_bytes)
    if isinstance(marker, commit.PendingMarker):
        marker.check_live()
    commit.write_manifest(storage, uuid, manifest)
    return manifest
