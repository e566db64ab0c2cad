"""``Determined``: the SDK object of ``determined.experimental.Determined`` (Determined's older
entry point, still in 0.38.1), over ckptstore's registry and storage instead of a master.

It owns the SDK calls; :mod:`ckptstore.experimental.client`'s functions are the same calls on a
process-wide ``Determined`` (as in Determined, whose ``client`` module wraps one too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore._not_supported import not_supported
from ckptstore.experimental._checkpoint import Checkpoint
from ckptstore.experimental._enums import (
    ExperimentState,
    ModelSortBy,
    OrderBy,
    TrialSortBy,
    sort_rows,
)
from ckptstore.experimental._experiment import Experiment, Trial
from ckptstore.experimental._metrics import (
    TrialMetrics,
    iter_metrics,
)
from ckptstore.experimental._model import Model
from ckptstore.experimental._session import Session, default_session

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage

logger = logging.getLogger(__name__)

_NO_USERS = "the registry's database permissions (there are no ckptstore users)"
_NO_WORKSPACES = "experiment names and model labels (there are no workspaces)"


class Determined:
    """Determined's SDK object: checkpoints, trials, experiments and models of the registry.

    Determined's arguments (``master``, ``user``, ``password``, certificates) are accepted and
    ignored: there is no master to log in to. The registry and storage come from ``registry=`` /
    ``storage=`` (ckptstore's additions), else ``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE``,
    else the defaults. Calls that need a cluster (users, workspaces, OAuth,
    ``create_experiment``) raise :class:`~ckptstore.errors.NotSupported` naming the alternative.

    Args:
        master: Determined's master address; ignored (logged).
        user: Determined's; ignored.
        password: Determined's; ignored.
        cert_path: Determined's; ignored.
        cert_name: Determined's; ignored.
        noverify: Determined's; ignored.
        registry: a registry URL or an open ``Registry`` (default: the environment's).
        storage: a storage URL, config dict or open ``Storage`` (default: the environment's).

    Example::

        from ckptstore.experimental import Determined

        d = Determined()                      # Determined(master=...) works too
        best = d.get_experiment(1).top_checkpoint()
        path = d.get_checkpoint(best.uuid).download("/tmp/best")
    """

    def __init__(
        self,
        master: str | None = None,
        user: str | None = None,
        password: str | None = None,
        cert_path: str | None = None,
        cert_name: str | None = None,
        noverify: bool = False,
        *,
        registry: Registry | str | None = None,
        storage: str | Mapping[str, Any] | Storage | None = None,
    ) -> None:
        if master is not None:
            logger.info("Determined(master=%r) ignored: ckptstore reads its registry", master)
        self._session: Session | None = (
            Session(registry=registry, storage=storage)
            if registry is not None or storage is not None
            else None
        )

    @classmethod
    def _over(cls, session: Session) -> Determined:
        """A Determined over an existing session (the client module's process-wide one)."""
        new = cls.__new__(cls)
        new._session = session
        return new

    def _s(self) -> Session:
        # Without registry=/storage=, follow the process-wide session, so client.configure()
        # reaches Determined objects made before it (as login() does in Determined).
        return self._session if self._session is not None else default_session()

    def logout(self) -> None:
        """Accepted and ignored (there is no master session)."""

    def get_checkpoint(self, uuid: str) -> Checkpoint:
        """The checkpoint with this UUID; :class:`~ckptstore.errors.CheckpointNotFound` if none."""
        return Checkpoint(self._s(), uuid)

    def get_trial(self, trial_id: int) -> Trial:
        """The trial; :class:`~ckptstore.errors.TrialNotFound` if none."""
        return Trial(trial_id, self._s())

    def get_experiment(self, experiment_id: int) -> Experiment:
        """The experiment; :class:`~ckptstore.errors.ExperimentNotFound` if none."""
        return Experiment(experiment_id, self._s())

    def list_experiments(
        self,
        sort_by: TrialSortBy | None = None,
        order_by: OrderBy | None = None,
        experiment_ids: list[int] | None = None,
        labels: list[str] | None = None,
        users: list[str] | None = None,
        states: list[ExperimentState] | None = None,
        name: str | None = None,
        project_id: int | None = None,
    ) -> list[Experiment]:
        """Experiments, filtered by ids, labels, states or name (users and projects do not
        exist here and must be None)."""
        if users is not None or project_id is not None:
            raise errors.NotSupported(
                "list_experiments(users=..., project_id=...) filters by master-side users and "
                "projects, which ckptstore does not have; filter by name, labels or states "
                f"instead. Received: users={users!r}, project_id={project_id!r}."
            )
        session = self._s()
        found = []
        for row in session.registry().list_experiments():
            if experiment_ids is not None and row.id not in experiment_ids:
                continue
            if name is not None and name not in (row.name or ""):
                continue
            exp = Experiment(row.id, session)
            if labels is not None and not set(labels) & set(exp.labels):
                continue
            if states is not None and exp.state not in states:
                continue
            found.append(exp)
        if order_by is not None and order_by.value == OrderBy.DESCENDING.value:
            found.reverse()
        return found

    def create_model(
        self,
        name: str,
        description: str | None = "",
        metadata: dict[str, Any] | None = None,
        labels: list[str] | None = None,
        workspace_name: str | None = None,
    ) -> Model:
        """Register a new model; :class:`~ckptstore.errors.ModelVersionConflict` if the name
        is taken. ``workspace_name`` must be None (there are no workspaces)."""
        if workspace_name is not None:
            raise errors.NotSupported(
                f"create_model(workspace_name=...) needs master-side workspaces; use "
                f"{_NO_WORKSPACES}. Received: workspace_name={workspace_name!r}."
            )
        session = self._s()
        session.registry().create_model(name, description or "", metadata=metadata)
        model = Model(session, name)
        if labels:
            model.set_labels(list(labels))
        return model

    def get_model(self, identifier: str | int) -> Model:
        """The registered model named ``identifier``."""
        return Model(self._s(), str(identifier))

    def get_model_by_id(self, model_id: int) -> Model:
        """Models are identified by name here; ``model_id`` is the name (``Model.model_id``)."""
        return self.get_model(model_id)

    def list_models(
        self,
        sort_by: ModelSortBy = ModelSortBy.NAME,
        order_by: OrderBy = OrderBy.ASCENDING,
        name: str | None = None,
        description: str | None = None,
        model_id: int | None = None,
        workspace_names: list[str] | None = None,
        workspace_ids: list[int] | None = None,
    ) -> list[Model]:
        """Registered models (not archived), filtered by name/description substrings."""
        if workspace_names or workspace_ids:
            raise errors.NotSupported(
                "list_models(workspace_...) filters by master-side workspaces; filter by name. "
                f"Received: workspace_names={workspace_names!r}, workspace_ids={workspace_ids!r}."
            )
        keys = {
            ModelSortBy.NAME: lambda m: m.name,
            ModelSortBy.DESCRIPTION: lambda m: m.description,
            ModelSortBy.CREATION_TIME: lambda m: m.created_at,
            ModelSortBy.LAST_UPDATED_TIME: lambda m: m.updated_at,
        }
        session = self._s()
        rows = [
            m
            for m in session.registry().list_models()
            if (name is None or name in m.name)
            and (description is None or description in m.description)
            and (model_id is None or str(model_id) == m.name)
        ]
        rows = sort_rows(rows, sort_by, order_by, keys)
        return [Model(session, m.name) for m in rows]

    def get_models(
        self,
        sort_by: ModelSortBy = ModelSortBy.NAME,
        order_by: OrderBy = OrderBy.ASCENDING,
        name: str | None = None,
        description: str | None = None,
        model_id: int | None = None,
        workspace_names: list[str] | None = None,
        workspace_ids: list[int] | None = None,
    ) -> list[Model]:
        """Determined's deprecated name for :meth:`list_models`."""
        return self.list_models(
            sort_by, order_by, name, description, model_id, workspace_names, workspace_ids
        )

    def get_model_labels(self) -> list[str]:
        """Every label used by a registered model, most used first."""
        counts: dict[str, int] = {}
        for model in self._s().registry().list_models(include_archived=True):
            for label in model.labels:
                counts[label] = counts.get(label, 0) + 1
        return sorted(counts, key=lambda k: (-counts[k], k))

    def iter_trials_metrics(self, trial_ids: list[int], group: str) -> Iterator[TrialMetrics]:
        """Every ``group`` report of the trials, oldest first per trial."""
        return iter_metrics(self._s(), trial_ids, group)

    def stream_trials_metrics(self, trial_ids: list[int], group: str) -> Iterator[TrialMetrics]:
        """Determined's deprecated name for :meth:`iter_trials_metrics`."""
        return self.iter_trials_metrics(trial_ids, group)

    def stream_trials_training_metrics(self, trial_ids: list[int]) -> Iterator[TrialMetrics]:
        return self.iter_trials_metrics(trial_ids, "training")

    def stream_trials_validation_metrics(self, trial_ids: list[int]) -> Iterator[TrialMetrics]:
        return self.iter_trials_metrics(trial_ids, "validation")

    create_experiment = not_supported(
        "Determined.create_experiment", "`ckptstore experiment create CONFIG MODEL_DIR`"
    )
    whoami = not_supported("Determined.whoami", _NO_USERS)
    get_session_username = not_supported("Determined.get_session_username", _NO_USERS)
    create_user = not_supported("Determined.create_user", _NO_USERS)
    get_user_by_id = not_supported("Determined.get_user_by_id", _NO_USERS)
    get_user_by_name = not_supported("Determined.get_user_by_name", _NO_USERS)
    list_users = not_supported("Determined.list_users", _NO_USERS)
    create_workspace = not_supported("Determined.create_workspace", _NO_WORKSPACES)
    delete_workspace = not_supported("Determined.delete_workspace", _NO_WORKSPACES)
    get_workspace = not_supported("Determined.get_workspace", _NO_WORKSPACES)
    list_workspaces = not_supported("Determined.list_workspaces", _NO_WORKSPACES)
    add_oauth_client = not_supported("Determined.add_oauth_client", _NO_USERS)
    list_oauth_clients = not_supported("Determined.list_oauth_clients", _NO_USERS)
    remove_oauth_client = not_supported("Determined.remove_oauth_client", _NO_USERS)


__all__ = ["Determined"]
