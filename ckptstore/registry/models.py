"""Registered models and their versions (Determined's model registry, same names).

A :class:`Model` is a name with a description, labels and metadata; each
:meth:`Model.register_version` pins a committed checkpoint as version 1, 2, ... (numbers are
never reused, even after a version is deleted). An alias such as ``"production"`` points at one
version of a model; moving it to another version takes it from the old one. Checkpoints pinned by
a version are never deleted by GC (:meth:`Registry.protected_checkpoint_uuids`).

Example::

    from ckptstore.registry import Registry

    with Registry() as registry:
        model = registry.create_model("mnist-cnn", labels=["vision"])
        v1 = model.register_version(registry.latest_checkpoint(trial_id=1).uuid)
        model.set_alias(v1.version, "production")
        print(model.get_version("production").checkpoint.uuid)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import getpass
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ckptstore import errors
from ckptstore.checkpointing.index import COMMITTED, PARTIALLY_DELETED
from ckptstore.registry import schema
from ckptstore.registry.rows import checkpoint_from_row, checkpoint_not_found
from ckptstore.validators import is_int

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.registry.db import Database
    from ckptstore.registry.entities import Checkpoint
    from ckptstore.registry.registry import Registry

_MO = schema.models
_V = schema.model_versions
_A = schema.model_aliases
_AE = schema.model_alias_events
_C = schema.checkpoints


@dataclasses.dataclass
class ModelVersion:
    """One version of a registered model: a pinned checkpoint, aliases and notes."""

    model_name: str
    version: int
    checkpoint: Checkpoint
    aliases: list[str]
    notes: str
    created_at: _dt.datetime
    _store: ModelStore = dataclasses.field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def checkpoint_uuid(self) -> str:
        return self.checkpoint.uuid

    def set_notes(self, notes: str) -> None:
        """Replace this version's notes."""
        if not isinstance(notes, str):
            raise errors.InvalidConfig(f"notes must be a string. Received: {type(notes).__name__}")
        self._store.set_version_notes(self.model_name, self.version, notes)
        self.notes = notes

    def delete(self) -> None:
        """Delete this version (its number is not reused) and its aliases."""
        self._store.delete_version(self.model_name, self.version)


@dataclasses.dataclass
class Model:
    """A registered model. Mutating methods write to the registry and refresh the fields."""

    name: str
    description: str
    labels: list[str]
    metadata: dict[str, Any]
    archived: bool
    created_at: _dt.datetime
    updated_at: _dt.datetime
    _store: ModelStore = dataclasses.field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    # ---- versions -----------------------------------------------------------------------------
    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        """Pin a COMMITTED/PARTIALLY_DELETED checkpoint as the next version;
        :class:`~ckptstore.errors.CheckpointNotFound` if the registry has no such live
        checkpoint."""
        return self._store.register_version(self.name, checkpoint_uuid)

    def get_version(self, version: int | str = -1) -> ModelVersion:
        """Version number ``version`` (``-1``: the latest) or the version an alias points at;
        :class:`~ckptstore.errors.ModelNotFound` if there is none."""
        return self._store.get_version(self.name, version)

    def list_versions(self) -> list[ModelVersion]:
        """All versions, oldest first."""
        return self._store.list_versions(self.name)

    def set_alias(self, version: int, alias: str, *, by: str | None = None) -> None:
        """Point ``alias`` (e.g. ``"production"``) at ``version``, taking it from any other.
        The move is recorded with ``by`` (default: the operating-system user) and the time
        (:meth:`alias_history`)."""
        self._store.set_alias(self.name, version, alias, by=by)

    def remove_alias(self, alias: str, *, by: str | None = None) -> None:
        """Remove an alias (recorded like a move); :class:`~ckptstore.errors.ModelNotFound` if
        it is not set."""
        self._store.remove_alias(self.name, alias, by=by)

    def alias_history(
        self, alias: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Every move of this model's aliases (or of one), newest first (at most ``limit``):
        ``alias``, ``version`` (None: removed), ``previous``, ``moved_by``, ``moved_at``."""
        return self._store.alias_history(self.name, alias, limit)

    # ---- fields -------------------------------------------------------------------------------
    def add_labels(self, labels: Iterable[str] | str) -> None:
        """Add labels (kept in order, without duplicates)."""
        new = _labels(labels)
        self._update(lambda row: {"labels": row.labels + [x for x in new if x not in row.labels]})

    def remove_labels(self, labels: Iterable[str] | str) -> None:
        """Remove labels (absent ones are ignored)."""
        gone = set(_labels(labels))
        self._update(lambda row: {"labels": [x for x in row.labels if x not in gone]})

    def set_description(self, description: str) -> None:
        """Replace the description."""
        if not isinstance(description, str):
            raise errors.InvalidConfig(
                f"description must be a string. Received: {type(description).__name__}"
            )
        self._update(lambda row: {"description": description})

    def add_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Merge keys into the metadata (top level; existing keys are replaced)."""
        if not isinstance(metadata, Mapping):
            raise errors.InvalidConfig(
                f"metadata must be a dict. Received: {type(metadata).__name__}"
            )
        self._update(lambda row: {"metadata": {**row.metadata, **dict(metadata)}})

    def remove_metadata(self, keys: Iterable[str] | str) -> None:
        """Remove top-level metadata keys (absent ones are ignored)."""
        gone = {keys} if isinstance(keys, str) else set(keys)
        self._update(
            lambda row: {"metadata": {k: v for k, v in row.metadata.items() if k not in gone}}
        )

    def archive(self) -> None:
        """Hide the model from ``list_models()`` and block new versions."""
        self._update(lambda row: {"archived": True}, allow_archived=True)

    def unarchive(self) -> None:
        """Undo :meth:`archive`."""
        self._update(lambda row: {"archived": False}, allow_archived=True)

    def delete(self) -> None:
        """Delete the model with all its versions and aliases (the checkpoints stay)."""
        self._store.delete_model(self.name)

    def _update(self, change: Any, allow_archived: bool = False) -> None:
        fresh = self._store.update(self.name, change, allow_archived)
        for field in ("description", "labels", "metadata", "archived", "updated_at"):
            setattr(self, field, getattr(fresh, field))


class ModelStore:
    """The SQL behind :class:`Model` and :class:`ModelVersion` (used by the Registry)."""

    def __init__(self, db: Database, registry: Registry) -> None:
        self._db = db
        self._registry = registry

    # ---- models -------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        description: str = "",
        labels: Iterable[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Model:
        _check_name(name)
        if not isinstance(description, str):
            raise errors.InvalidConfig(
                f"description must be a string. Received: {type(description).__name__}"
            )
        if metadata is not None and not isinstance(metadata, Mapping):
            raise errors.InvalidConfig(
                f"metadata must be a dict. Received: {type(metadata).__name__}"
            )
        now = schema.utcnow()
        values = {
            "name": name,
            "description": description,
            "labels": _labels(labels or []),
            "metadata": dict(metadata or {}),
            "archived": False,
            "last_version": 0,
            "created_at": now,
            "updated_at": now,
        }

        def fn(conn: sa.Connection) -> Model:
            stmt = self._db.insert(_MO).values(**values).on_conflict_do_nothing()
            if not self._db.inserted(conn, stmt):
                raise errors.ModelVersionConflict(
                    f"A model named {name!r} already exists. Use get_model({name!r}) to add "
                    "versions to it, or choose another name."
                )
            return self._model(self._row(conn, name))

        return self._db.write(fn, what="create a model")

    def get(self, name: str) -> Model:
        return self._db.read(lambda conn: self._model(self._row(conn, name)), what="get a model")

    def list(self, include_archived: bool) -> list[Model]:
        query = sa.select(_MO).order_by(_MO.c.name)
        if not include_archived:
            query = query.where(_MO.c.archived.is_(False))
        return self._db.read(
            lambda conn: [self._model(r) for r in conn.execute(query)], what="list models"
        )

    def update(self, name: str, change: Any, allow_archived: bool) -> Model:
        def fn(conn: sa.Connection) -> Model:
            row = self._row(conn, name, for_update=True)
            if row.archived and not allow_archived:
                raise _archived(name)
            values = change(_Fields(row))
            values["updated_at"] = schema.utcnow()
            conn.execute(_MO.update().where(_MO.c.id == row.id).values(**values))
            return self._model(self._row(conn, name))

        return self._db.write(fn, what="update a model")

    def delete_model(self, name: str) -> None:
        def fn(conn: sa.Connection) -> None:
            row = self._row(conn, name, for_update=True)
            conn.execute(_A.delete().where(_A.c.model_id == row.id))
            conn.execute(_AE.delete().where(_AE.c.model_id == row.id))
            conn.execute(_V.delete().where(_V.c.model_id == row.id))
            conn.execute(_MO.delete().where(_MO.c.id == row.id))

        self._db.write(fn, what="delete a model")

    # ---- versions -----------------------------------------------------------------------------
    def register_version(self, name: str, checkpoint_uuid: str) -> ModelVersion:

        def fn(conn: sa.Connection) -> ModelVersion:
            row = self._row(conn, name, for_update=True)
            if row.archived:
                raise _archived(name)
            state = conn.execute(
                sa.select(_C.c.state).where(_C.c.uuid == str(checkpoint_uuid))
            ).scalar()
            if state not in (COMMITTED, PARTIALLY_DELETED):
                raise (
                    checkpoint_not_found(checkpoint_uuid)
                    if state is None
                    else (
                        errors.CheckpointNotFound(
                            f"Checkpoint {checkpoint_uuid!r} is {state}, not COMMITTED; only "
                            "committed checkpoints can be registered as a model version."
                        )
                    )
                )
            conn.execute(
                _MO.update()
                .where(_MO.c.id == row.id)
                .values(last_version=_MO.c.last_version + 1, updated_at=schema.utcnow())
            )
            number = conn.execute(
                sa.select(_MO.c.last_version).where(_MO.c.id == row.id)
            ).scalar_one()
            conn.execute(
                _V.insert().values(
                    model_id=row.id,
                    version=number,
                    checkpoint_uuid=str(checkpoint_uuid),
                    notes="",
                    created_at=schema.utcnow(),
                )
            )
            return self._version(conn, row, number)

        return self._db.write(fn, what="register a model version")

    def get_version(self, name: str, version: int | str) -> ModelVersion:
        def fn(conn: sa.Connection) -> ModelVersion:
            row = self._row(conn, name)
            return self._version(conn, row, self._resolve(conn, row, version))

        return self._db.read(fn, what="get a model version")

    def list_versions(self, name: str) -> list[ModelVersion]:
        def fn(conn: sa.Connection) -> list[ModelVersion]:
            row = self._row(conn, name)
            numbers = conn.execute(
                sa.select(_V.c.version).where(_V.c.model_id == row.id).order_by(_V.c.version)
            ).scalars()
            return [self._version(conn, row, n) for n in list(numbers)]

        return self._db.read(fn, what="list model versions")

    def set_alias(self, name: str, version: int, alias: str, *, by: str | None = None) -> None:
        _check_alias(alias)

        def fn(conn: sa.Connection) -> None:
            row = self._row(conn, name, for_update=True)
            number = self._resolve(conn, row, version)
            version_id = self._version_id(conn, row, number)
            previous = self._alias_version(conn, row.id, alias)
            conn.execute(_A.delete().where(_A.c.model_id == row.id, _A.c.alias == alias))
            conn.execute(_A.insert().values(model_id=row.id, alias=alias, version_id=version_id))
            self._record_move(conn, row.id, alias, number, previous, by)

        self._db.write(fn, what="set a model alias")

    def remove_alias(self, name: str, alias: str, *, by: str | None = None) -> None:
        def fn(conn: sa.Connection) -> None:
            row = self._row(conn, name, for_update=True)
            previous = self._alias_version(conn, row.id, alias)
            result = conn.execute(_A.delete().where(_A.c.model_id == row.id, _A.c.alias == alias))
            if result.rowcount == 0:
                raise errors.ModelNotFound(
                    f"Model {name!r} has no alias {alias!r}. list_versions() shows the aliases."
                )
            self._record_move(conn, row.id, alias, None, previous, by)

        self._db.write(fn, what="remove a model alias")

    @staticmethod
    def _alias_version(conn: sa.Connection, model_id: int, alias: str) -> int | None:
        return conn.execute(
            sa.select(_V.c.version)
            .join(_A, _A.c.version_id == _V.c.id)
            .where(_A.c.model_id == model_id, _A.c.alias == alias)
        ).scalar()

    @staticmethod
    def _record_move(
        conn: sa.Connection,
        model_id: int,
        alias: str,
        version: int | None,
        previous: int | None,
        by: str | None,
    ) -> None:
        conn.execute(
            _AE.insert().values(
                model_id=model_id,
                alias=alias,
                version=version,
                previous=previous,
                moved_by=(by or _os_user())[:256],
                moved_at=schema.utcnow(),
            )
        )

    def alias_history(
        self, name: str, alias: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        def fn(conn: sa.Connection) -> list[dict[str, Any]]:
            row = self._row(conn, name)
            query = sa.select(_AE).where(_AE.c.model_id == row.id)
            if alias is not None:
                query = query.where(_AE.c.alias == alias)
            return [
                {
                    "alias": r.alias,
                    "version": r.version,
                    "previous": r.previous,
                    "moved_by": r.moved_by,
                    "moved_at": schema.from_db_time(r.moved_at),
                }
                for r in conn.execute(query.order_by(_AE.c.id.desc()).limit(limit))
            ]

        return self._db.read(fn, what="read a model's alias history")

    def set_version_notes(self, name: str, version: int, notes: str) -> None:
        def fn(conn: sa.Connection) -> None:
            row = self._row(conn, name, for_update=True)
            version_id = self._version_id(conn, row, version)
            conn.execute(_V.update().where(_V.c.id == version_id).values(notes=notes))

        self._db.write(fn, what="set model version notes")

    def delete_version(self, name: str, version: int) -> None:
        def fn(conn: sa.Connection) -> None:
            row = self._row(conn, name, for_update=True)
            version_id = self._version_id(conn, row, version)
            conn.execute(_A.delete().where(_A.c.version_id == version_id))
            conn.execute(_V.delete().where(_V.c.id == version_id))

        self._db.write(fn, what="delete a model version")

    def protected_uuids(self) -> set[str]:
        return self._db.read(
            lambda conn: set(conn.execute(sa.select(_V.c.checkpoint_uuid).distinct()).scalars()),
            what="list protected checkpoints",
        )

    # ---- helpers ------------------------------------------------------------------------------
    def _row(self, conn: sa.Connection, name: str, for_update: bool = False) -> Any:
        query = sa.select(_MO).where(_MO.c.name == name)
        if for_update and self._db.dialect == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).first()
        if row is None:
            raise errors.ModelNotFound(
                f"No registered model named {name!r}. list_models(include_archived=True) shows "
                "them; create_model() makes one."
            )
        return row

    def _model(self, row: Any) -> Model:
        return Model(
            name=row.name,
            description=row.description,
            labels=list(row.labels or []),
            metadata=dict(row._mapping["metadata"] or {}),
            archived=bool(row.archived),
            created_at=schema.from_db_time(row.created_at),
            updated_at=schema.from_db_time(row.updated_at),
            _store=self,
        )

    def _resolve(self, conn: sa.Connection, row: Any, version: int | str) -> int:
        """A version number from ``-1``, a number, or an alias."""
        if isinstance(version, str):
            number = conn.execute(
                sa.select(_V.c.version)
                .join(_A, _A.c.version_id == _V.c.id)
                .where(_A.c.model_id == row.id, _A.c.alias == version)
            ).scalar()
            if number is None and version.lstrip("-").isdigit():
                return self._resolve(conn, row, int(version))
            if number is None:
                raise errors.ModelNotFound(
                    f"Model {row.name!r} has no alias {version!r}. Use a version number, -1 for "
                    "the latest, or an alias set with set_alias()."
                )
            return int(number)
        if not is_int(version):
            raise errors.InvalidConfig(
                f"version must be an int (-1 for the latest) or an alias. Received: {version!r}"
            )
        if version == -1:
            number = conn.execute(
                sa.select(sa.func.max(_V.c.version)).where(_V.c.model_id == row.id)
            ).scalar()
            if number is None:
                raise errors.ModelNotFound(
                    f"Model {row.name!r} has no versions yet; register one with "
                    "register_version(checkpoint_uuid)."
                )
            return int(number)
        self._version_id(conn, row, version)
        return version

    def _version_id(self, conn: sa.Connection, row: Any, version: int) -> int:
        found = conn.execute(
            sa.select(_V.c.id).where(_V.c.model_id == row.id, _V.c.version == version)
        ).scalar()
        if found is None:
            raise errors.ModelNotFound(
                f"Model {row.name!r} has no version {version!r}; list_versions() shows them."
            )
        return int(found)

    def _version(self, conn: sa.Connection, row: Any, number: int) -> ModelVersion:

        vrow = conn.execute(
            sa.select(_V).where(_V.c.model_id == row.id, _V.c.version == number)
        ).one()
        ckpt = conn.execute(sa.select(_C).where(_C.c.uuid == vrow.checkpoint_uuid)).one()
        aliases = conn.execute(
            sa.select(_A.c.alias).where(_A.c.version_id == vrow.id).order_by(_A.c.alias)
        ).scalars()
        return ModelVersion(
            model_name=row.name,
            version=int(vrow.version),
            checkpoint=checkpoint_from_row(ckpt),
            aliases=list(aliases),
            notes=vrow.notes,
            created_at=schema.from_db_time(vrow.created_at),
            _store=self,
        )


class _Fields:
    """A model row's mutable fields, copied, for ``Model._update`` callbacks."""

    def __init__(self, row: Any) -> None:
        self.labels: list[str] = list(row.labels or [])
        self.metadata: dict[str, Any] = dict(row._mapping["metadata"] or {})
        self.description: str = row.description


def _labels(labels: Iterable[str] | str) -> list[str]:
    items = [labels] if isinstance(labels, str) else list(labels)
    for item in items:
        if not isinstance(item, str) or not item:
            raise errors.InvalidConfig(f"Labels must be non-empty strings. Received: {item!r}")
    return list(dict.fromkeys(items))


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name.strip():
        raise errors.InvalidConfig(f"A model name must be a non-empty string. Received: {name!r}")


def _os_user() -> str:
    """Who moved an alias when the caller did not say: the operating-system user."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment (a bare container)
        return "unknown"


def _check_alias(alias: Any) -> None:
    if not isinstance(alias, str) or not alias.strip() or alias.lstrip("-").isdigit():
        raise errors.InvalidConfig(
            "An alias must be a non-empty string that is not a number (numbers name versions). "
            f"Received: alias={alias!r}"
        )


def _archived(name: str) -> errors.RegistryError:
    return errors.RegistryError(
        f"Model {name!r} is archived and cannot be changed; call unarchive() first."
    )
