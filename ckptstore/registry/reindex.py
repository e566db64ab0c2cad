"""Rebuilding the registry's checkpoint index from storage (storage is the source of truth).

:func:`reindex` reads every committed checkpoint in a storage (its ``MANIFEST.json`` and
``metadata.json``, through :func:`ckptstore.checkpointing.format.scan_checkpoints`), upserts a
checkpoint row for each (creating trial and experiment rows as needed), and marks rows of that
storage that are COMMITTED or PARTIALLY_DELETED in the index but no longer in storage as
DELETED. PENDING rows are left alone (their upload may still be running). A new machine with
only the bucket recovers the index this way.

Example::

    from ckptstore.registry import Registry
    from ckptstore.storage_backends import open_storage

    with Registry("sqlite:///new.db") as registry:
        n = registry.reindex(open_storage("s3://bucket/ckpts"))
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ckptstore.checkpointing.index import COMMITTED, DELETED, PARTIALLY_DELETED, CheckpointRecord
from ckptstore.registry import schema
from ckptstore.registry.rows import checkpoint_values

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.registry.registry import Registry
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: Checkpoints upserted per transaction (keeps transactions short under concurrency).
BATCH = 200

_C = schema.checkpoints


def reindex(registry: Registry, storage: Storage) -> int:
    """Make ``registry``'s checkpoint rows for ``storage`` match what ``storage`` holds.
    Returns the number of committed checkpoints found in storage."""
    from ckptstore.checkpointing.format import scan_checkpoints

    records: list[CheckpointRecord] = []
    for found in scan_checkpoints(storage):
        record = dataclasses.replace(found)
        if not record.storage_url:
            record.storage_url = storage.url
        records.append(record)

    db = registry._db
    for start in range(0, len(records), BATCH):
        batch = [(r, checkpoint_values(r)) for r in records[start : start + BATCH]]

        def upsert(conn: sa.Connection, batch=batch) -> None:
            for record, values in batch:
                registry.upsert_checkpoint_row(conn, record, values)

        db.write(upsert, what="reindex checkpoints")

    urls = {storage.url} | {r.storage_url for r in records}
    present = {r.uuid for r in records}

    def live_uuids(conn: sa.Connection) -> list[str]:
        query = sa.select(_C.c.uuid).where(
            _C.c.storage_url.in_(sorted(urls)), _C.c.state.in_((COMMITTED, PARTIALLY_DELETED))
        )
        return list(conn.execute(query).scalars())

    gone = [u for u in db.read(live_uuids, what="reindex checkpoints") if u not in present]
    for start in range(0, len(gone), BATCH):
        chunk = gone[start : start + BATCH]

        def mark(conn: sa.Connection, chunk=chunk) -> None:
            conn.execute(
                _C.update()
                .where(_C.c.uuid.in_(chunk), _C.c.state.in_((COMMITTED, PARTIALLY_DELETED)))
                .values(state=DELETED, updated_at=schema.utcnow())
            )

        db.write(mark, what="reindex checkpoints")
    logger.info(
        "Reindexed %s: %d checkpoints in storage, %d index rows marked DELETED",
        storage.url,
        len(records),
        len(gone),
    )
    return len(records)
