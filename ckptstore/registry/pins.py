"""Checkpoint pins: leases in the registry that keep GC, in any process, from deleting a
checkpoint (the registry side of :class:`ckptstore.checkpointing.index.PinningIndex`).

A pin is one row per ``(checkpoint uuid, holder)`` with an optional expiry. Unexpired pins
count in :meth:`Registry.protected_checkpoint_uuids`; expired ones are ignored (a crashed
process cannot pin forever) and purged when pins are written. Expiry is judged by the clock
of the process reading the pins, so leases should be long next to the clock skew between
machines (``CheckpointContext`` uses 10 minutes, renewed every 200 s).

Example::

    import datetime as dt
    from ckptstore.registry import Registry

    with Registry() as registry:
        until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
        registry.pin_checkpoint(uuid, "me:debugging", until)
        print(registry.list_pins(uuid))
        registry.unpin_checkpoint(uuid, "me:debugging")
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.registry import schema
from ckptstore.registry.db import Database

_P = schema.checkpoint_pins


@dataclasses.dataclass(frozen=True)
class Pin:
    """One pin: ``holder`` keeps checkpoint ``uuid`` from GC until ``expires_at`` (None:
    until unpinned). Times are aware UTC."""

    uuid: str
    holder: str
    expires_at: _dt.datetime | None
    created_at: _dt.datetime | None
    updated_at: _dt.datetime | None

    @property
    def expired(self) -> bool:
        """True once ``expires_at`` has passed."""
        return self.expires_at is not None and self.expires_at <= _dt.datetime.now(_dt.timezone.utc)


class PinStore:
    """Reads and writes the ``checkpoint_pins`` table (used by :class:`Registry`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def pin(self, uuid: str, holder: str, expires_at: _dt.datetime | None) -> None:
        _check_text(uuid, "uuid", 64)
        _check_text(holder, "holder", 256)
        if expires_at is not None and not isinstance(expires_at, _dt.datetime):
            raise errors.InvalidConfig(
                "expires_at must be a datetime (UTC) or None (until unpinned). Received: "
                f"expires_at={expires_at!r}"
            )
        expires = None if expires_at is None else schema.to_db_time(expires_at)

        def fn(conn: sa.Connection) -> None:
            now = schema.utcnow()
            conn.execute(_P.delete().where(_P.c.expires_at.is_not(None), _P.c.expires_at <= now))
            stmt = self._db.insert(_P).values(
                checkpoint_uuid=uuid,
                holder=holder,
                expires_at=expires,
                created_at=now,
                updated_at=now,
            )
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[_P.c.checkpoint_uuid, _P.c.holder],
                    set_={"expires_at": expires, "updated_at": now},
                )
            )

        self._db.write(fn, what="pin a checkpoint")

    def unpin(self, uuid: str, holder: str) -> None:
        _check_text(uuid, "uuid", 64)
        _check_text(holder, "holder", 256)
        self._db.write(
            lambda conn: conn.execute(
                _P.delete().where(_P.c.checkpoint_uuid == uuid, _P.c.holder == holder)
            ),
            what="unpin a checkpoint",
        )

    def pinned_uuids(self) -> set[str]:
        """UUIDs with at least one unexpired pin."""

        def fn(conn: sa.Connection) -> set[str]:
            query = (
                sa.select(_P.c.checkpoint_uuid)
                .where(sa.or_(_P.c.expires_at.is_(None), _P.c.expires_at > schema.utcnow()))
                .distinct()
            )
            return set(conn.execute(query).scalars())

        return self._db.read(fn, what="list pinned checkpoints")

    def list_pins(self, uuid: str | None, include_expired: bool) -> list[Pin]:
        def fn(conn: sa.Connection) -> list[Pin]:
            query = sa.select(_P).order_by(_P.c.checkpoint_uuid, _P.c.holder)
            if uuid is not None:
                query = query.where(_P.c.checkpoint_uuid == uuid)
            if not include_expired:
                query = query.where(
                    sa.or_(_P.c.expires_at.is_(None), _P.c.expires_at > schema.utcnow())
                )
            return [_pin(row) for row in conn.execute(query)]

        return self._db.read(fn, what="list pins")


def _pin(row: Any) -> Pin:
    return Pin(
        uuid=row.checkpoint_uuid,
        holder=row.holder,
        expires_at=schema.from_db_time(row.expires_at),
        created_at=schema.from_db_time(row.created_at),
        updated_at=schema.from_db_time(row.updated_at),
    )


def _check_text(value: Any, name: str, limit: int) -> None:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise errors.InvalidConfig(
            f"A pin's {name} must be a non-empty string of at most {limit} characters. "
            f"Received: {name}={value!r}"
        )
