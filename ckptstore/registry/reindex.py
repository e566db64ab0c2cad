"""Rebuilding the registry's checkpoint index from storage (storage is the source of truth).

:func:`reindex` reads every committed checkpoint in a storage (its ``MANIFEST.json`` and
``metadata.json``, through :func:`ckptstore.checkpointing.scan.scan_checkpoints`), upserts a
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

from ckptstore import errors
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


def reindex(registry: Registry, storage: Storage, *, skipped: dict[str, str] | None = None) -> int:
    """Make ``registry``'s checkpoint rows for ``storage`` match what ``storage`` holds.
    Returns the number of checkpoints indexed. One bad checkpoint (a damaged manifest, a
    ``metadata.json`` with ``trial_id: "abc"`` or ``2**70``) never stops the others: it is
    logged, left out, and added to ``skipped`` (``{uuid: why}``) when given."""
    from ckptstore.checkpointing.scan import scan_checkpoints

    skipped = {} if skipped is None else skipped
    checked: list[tuple[CheckpointRecord, dict]] = []
    for found in scan_checkpoints(storage, skipped=skipped):
        record = dataclasses.replace(found)
        if not record.storage_url:
            record.storage_url = storage.url
        try:
            checked.append((record, checkpoint_values(record)))
        except errors.CkptstoreError as exc:
            _skip(skipped, record.uuid, exc)

    db = registry._db
    for start in range(0, len(checked), BATCH):
        _upsert(registry, checked[start : start + BATCH], skipped)
    records = [r for r, _ in checked if r.uuid not in skipped]

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
        "Reindexed %s: %d checkpoints in storage, %d left out as damaged, %d index rows "
        "marked DELETED",
        storage.url,
        len(records),
        len(skipped),
        len(gone),
    )
    return len(records)


def _skip(skipped: dict[str, str], uuid: str, exc: Exception) -> None:
    logger.warning("Reindex left out checkpoint %s: %s", uuid, exc)
    skipped[uuid] = str(exc)


def _upsert(
    registry: Registry, batch: list[tuple[CheckpointRecord, dict]], skipped: dict[str, str]
) -> None:
    """Write a batch in one transaction; if a value in it is refused (InvalidConfig, raised
    by the column types before the database sees it), write its records one by one so that
    only the refused record is left out. Other errors (the database is down) are raised."""

    def upsert(conn: sa.Connection) -> None:
        for record, values in batch:
            registry.upsert_checkpoint_row(conn, record, values)

    try:
        registry._db.write(upsert, what="reindex checkpoints")
    except errors.InvalidConfig as exc:
        if len(batch) == 1:
            _skip(skipped, batch[0][0].uuid, exc)
            return
        for one in batch:
            _upsert(registry, [one], skipped)
