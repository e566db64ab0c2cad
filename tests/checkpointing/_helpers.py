"""Test helpers: an in-memory CheckpointIndex (file trees: ``tests/_helpers/trees.py``)."""

from __future__ import annotations

import dataclasses
import threading

from ckptstore.checkpointing.index import (
    COMMITTED,
    PARTIALLY_DELETED,
    CheckpointRecord,
)


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
