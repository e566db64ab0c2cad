"""The SDK's model registry objects (Determined's ``client.Model`` and
``client.ModelVersion``) over ckptstore's registered models.

Example::

    from ckptstore.experimental import client

    model = client.create_model("mnist")
    model.register_version(checkpoint_uuid)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ckptstore._not_supported import not_supported
from ckptstore.experimental._checkpoint import Checkpoint
from ckptstore.experimental._enums import OrderBy, _descending
from ckptstore.experimental._metrics import TrialMetrics
from ckptstore.experimental._session import Session

if TYPE_CHECKING:
    from ckptstore.registry import models as registry_models


class ModelVersion:
    """One version of a registered model (Determined's ``client.ModelVersion``)."""

    def __init__(
        self, session: Session, model_version: registry_models.ModelVersion, model_name: str
    ) -> None:
        self._session = session
        self._version = model_version
        self.model_name = model_name
        self.model_version = model_version.version
        self.model_id: str = model_name
        self.checkpoint = Checkpoint(session, model_version.checkpoint_uuid)
        self.notes = model_version.notes
        self.name = model_version.aliases[0] if model_version.aliases else None
        self.comment: str | None = None
        self.metadata: dict[str, Any] = dict(self.checkpoint.metadata)

    def reload(self) -> None:
        fresh = self._session.registry().get_model(self.model_name).get_version(self.model_version)
        self.__init__(self._session, fresh, self.model_name)  # type: ignore[misc]

    def set_notes(self, notes: str) -> None:
        self._version.set_notes(notes)
        self.notes = notes

    def set_name(self, name: str) -> None:
        """Name this version: an alias, unique within the model (taken from another version)."""
        self._session.registry().get_model(self.model_name).set_alias(self.model_version, name)
        self.name = name

    def delete(self) -> None:
        self._version.delete()

    def get_metrics(self, group: str | None = None) -> Iterator[TrialMetrics]:
        return self.checkpoint.get_metrics(group)

    def iter_metrics(self, group: str | None = None) -> Iterator[TrialMetrics]:
        return self.get_metrics(group)

    def __repr__(self) -> str:
        return f"ModelVersion(model={self.model_name!r}, version={self.model_version})"


class Model:
    """A registered model (Determined's ``client.Model``).

    Example::

        model = client.create_model("mnist")
        model.register_version(checkpoint_uuid)
        latest = model.get_version()          # -1: the newest
    """

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self.name = name
        self.reload()

    def reload(self) -> None:
        self._model = self._session.registry().get_model(self.name)
        self.description = self._model.description
        self.labels: list[str] = list(self._model.labels)
        self.metadata: dict[str, Any] = dict(self._model.metadata)
        self.archived = self._model.archived
        self.creation_time = self._model.created_at
        self.last_updated_time = self._model.updated_at
        self.model_id: str = self.name
        self.username: str | None = None
        self.workspace_id: int | None = None

    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        version = self._model.register_version(checkpoint_uuid)
        return ModelVersion(self._session, version, self.name)

    def get_version(self, version: int = -1) -> ModelVersion:
        """Version ``version`` (``-1``: the newest; an alias set by ``set_name`` works too)."""
        return ModelVersion(self._session, self._model.get_version(version), self.name)

    def list_versions(self, order_by: OrderBy = OrderBy.DESCENDING) -> list[ModelVersion]:
        """All versions, newest first by default."""
        versions = [ModelVersion(self._session, v, self.name) for v in self._model.list_versions()]
        if _descending(order_by, OrderBy.DESCENDING):
            versions.reverse()
        return versions

    def get_versions(self, order_by: OrderBy = OrderBy.DESCENDING) -> list[ModelVersion]:
        """Determined's deprecated name for :meth:`list_versions`."""
        return self.list_versions(order_by)

    def set_description(self, description: str) -> None:
        self._model.set_description(description)
        self.reload()

    def set_labels(self, labels: list[str]) -> None:
        """Replace the labels."""
        self._model.remove_labels(list(self._model.labels))
        self._model.add_labels(list(labels))
        self.reload()

    def add_metadata(self, metadata: dict[str, Any]) -> None:
        self._model.add_metadata(metadata)
        self.reload()

    def remove_metadata(self, keys: list[str]) -> None:
        self._model.remove_metadata(keys)
        self.reload()

    def archive(self) -> None:
        self._model.archive()
        self.reload()

    def unarchive(self) -> None:
        self._model.unarchive()
        self.reload()

    def delete(self) -> None:
        self._model.delete()

    move_to_workspace = not_supported("Model.move_to_workspace", "model names and labels")

    def __repr__(self) -> str:
        return f"Model(name={self.name!r})"
