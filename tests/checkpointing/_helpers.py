"""Test helpers: an in-memory CheckpointIndex (file trees: ``tests/_helpers/trees.py``)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.index import (
    COMMITTED,
    PARTIALLY_DELETED,
    CheckpointRecord,
)


def write_manifest(storage: Any, uuid: str, damaged: Any) -> None:
    """Replace checkpoint ``uuid``'s MANIFEST.json by ``damaged`` (bytes, or an object written
    as JSON with NaN/inf as a forger may), behind ckptstore's back."""
    data = damaged if isinstance(damaged, bytes) else json.dumps(damaged).encode()
    key = f"{uuid}/{fmt.MANIFEST_NAME}"
    local = storage.local_path(key)
    if local is not None and os.path.exists(local):
        os.chmod(local, 0o644)  # committed manifests are read-only on local disk
    storage.write_bytes(key, data)


class MemoryIndex:
    """A minimal CheckpointIndex kept in a dict (the real Registry is tested elsewhere)."""

    def __init__(self) -> None:
        self.records: dict[str, CheckpointRecord] = {}
        self.protected: set[str] = set()
        self.calls: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def record_checkpoint(self, record: CheckpointRecord) -> None:
        with self._lock:
            self.records[record.uuid] = dataclasses.replace(record)
            self.calls.append(("record", record.uuid, record.state))

    def set_checkpoint_state(self, uuid, state, resources=None) -> None:
        with self._lock:
            record = self.records[uuid]
            record.state = state
            if resources is not None:
                record.resources = dict(resources)
            self.calls.append(("state", uuid, state))

    def checkpoint_records(
        self, *, trial_id=None, experiment_id=None, states=(COMMITTED, PARTIALLY_DELETED)
    ):
        with self._lock:
            rows = [
                r
                for r in self.records.values()
                if r.state in states
                and (trial_id is None or r.trial_id == trial_id)
                and (experiment_id is None or r.experiment_id == experiment_id)
            ]
        return sorted(rows, key=lambda r: (r.steps_completed, r.created_at))

    def protected_checkpoint_uuids(self) -> set[str]:
        return set(self.protected)


def backdate(monkeypatch, storage, key: str, seconds: float) -> None:
    """Make the object at ``key`` look ``seconds`` older to GC, which judges age by the
    storage's own timestamps: a real ``mtime`` change on a local store; on an object store
    (whose server stamps writes itself) the timestamp ``storage.modified_at`` reports."""
    path = storage.local_path(key)
    if path is not None:
        stamp = os.stat(path).st_mtime - seconds
        os.utime(path, (stamp, stamp))
        return
    real = storage.modified_at
    older = getattr(storage, "_backdated", {})
    older[key] = seconds
    monkeypatch.setattr(storage, "_backdated", older, raising=False)

    def modified_at(k: str) -> float:
        return real(k) - older.get(k, 0.0)

    if not hasattr(real, "_backdating"):
        modified_at._backdating = True  # type: ignore[attr-defined]
        monkeypatch.setattr(storage, "modified_at", modified_at)


def stored_folder(storage_url: str, uuid: str, dest) -> str:  # type: ignore[no-untyped-def]
    """Checkpoint ``uuid`` as ordinary files in ``dest`` (downloaded and verified): its
    stored folder holds only the manifest and metadata when it is deduplicated (the
    default), so tests that read a file of it go through this."""
    from ckptstore.checkpointing import CheckpointContext

    with CheckpointContext(storage_url) as reader:
        reader.download(uuid, str(dest))
    return str(dest)


def corrupt_stored(storage_url: str, uuid: str, rel: str) -> None:
    """Flip the first byte of stored file ``rel`` of checkpoint ``uuid`` in a local store: the
    file itself (whole-file layout) or its first chunk (deduplicated, the default)."""
    from ckptstore.checkpointing import blobs
    from ckptstore.storage_backends import open_storage

    with open_storage(storage_url) as storage:
        entry = fmt.read_manifest(storage, uuid)["files"][rel]
    key = blobs.blob_key(entry["blobs"][0]["sha256"]) if "blobs" in entry else f"{uuid}/{rel}"
    with open(os.path.join(storage_url, *key.split("/")), "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


def forge(storage: Any, uuid: str, change: Any) -> None:
    """Rewrite checkpoint ``uuid``'s manifest with ``change(files)`` applied: an attacker who
    can write the storage keeps sizes and checksums consistent."""
    manifest = fmt.read_manifest(storage, uuid)
    change(manifest["files"])
    write_manifest(storage, uuid, manifest)


def ec_key_pair(folder: Any, name: str = "key") -> tuple[str, str]:
    """``(private, public)`` PEM files of a new P-256 key (what model-signing signs with)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    key, pub = os.path.join(folder, f"{name}.pem"), os.path.join(folder, f"{name}-pub.pem")
    with open(key, "wb") as f:
        f.write(
            private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(pub, "wb") as f:
        f.write(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return key, pub


def same_crc32c(data: bytes, like: bytes) -> bytes:
    """``data`` (as long as ``like``) with its last 4 bytes chosen so its CRC-32C is
    ``like``'s: other bytes that pass a size + crc32c check. CRC is affine over GF(2), so
    the 4 bytes solve a 32x32 linear system."""
    from ckptstore.checkpointing.checksums import crc32c_bytes

    assert len(data) == len(like) >= 4

    def crc(tail: int) -> int:
        return int(crc32c_bytes(data[:-4] + tail.to_bytes(4, "little")), 16)

    base, want = crc(0), int(crc32c_bytes(like), 16)
    # rows: (effect of tail bit i on the CRC, bit i itself), reduced to a basis
    basis: list[tuple[int, int]] = []
    for i in range(32):
        effect, bits = crc(1 << i) ^ base, 1 << i
        for e, b in sorted(basis, reverse=True):  # highest leading bit first
            if effect ^ e < effect:
                effect, bits = effect ^ e, bits ^ b
        if effect:
            basis.append((effect, bits))
    target, tail = want ^ base, 0
    for e, b in sorted(basis, reverse=True):
        if target ^ e < target:
            target, tail = target ^ e, tail ^ b
    assert target == 0
    return data[:-4] + tail.to_bytes(4, "little")
