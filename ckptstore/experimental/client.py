"""``ckptstore.experimental.client``: Determined's Python SDK over ckptstore's registry and
storage (no master). ``from determined.experimental import client`` code runs with
``from ckptstore.experimental import client``.

The registry and storage come from ``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE`` (else the
defaults of :mod:`ckptstore.defaults`), or from :func:`configure`. :func:`login` and
:func:`logout` are accepted and do nothing (there is no master to log in to); calls that only
make sense on a cluster (users, workspaces, OAuth, ``create_experiment``) raise
:class:`~ckptstore.errors.NotSupported` naming what to use instead.

Example (Determined's batch-inference recipe)::

    from ckptstore.experimental import client
    import ckptstore as det

    path = client.get_checkpoint(uuid).download("/tmp/ckpt")
    model = det.keras.load_model_from_checkpoint_path(path)

    best = client.get_experiment(1).top_checkpoint()
    client.create_model("mnist").register_version(best.uuid)
    client.get_model("mnist").get_version().checkpoint.download("/tmp/prod")
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore._not_supported import not_supported
from ckptstore.experimental._checkpoint import Checkpoint
from ckptstore.experimental._determined import Determined
from ckptstore.experimental._enums import (
    CheckpointOrderBy,
    CheckpointSortBy,
    CheckpointState,
    DownloadMode,
    ExperimentSortBy,
    ExperimentState,
    ModelSortBy,
    OrderBy,
    TrialSortBy,
    TrialState,
)
from ckptstore.experimental._experiment import Experiment, Trial
from ckptstore.experimental._metrics import (
    TrainingMetrics,
    TrialMetrics,
    ValidationMetrics,
)
from ckptstore.experimental._model import Model, ModelVersion
from ckptstore.experimental._session import Session, default_session, set_default_session

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage

logger = logging.getLogger(__name__)

#: Determined's deprecated aliases of :class:`OrderBy`.
ModelOrderBy = OrderBy
TrialOrderBy = OrderBy
ExperimentOrderBy = OrderBy


def configure(
    registry: Registry | str | None = None,
    storage: str | Mapping[str, Any] | Storage | None = None,
) -> None:
    """Point the client at a registry and storage (default: the environment's). ckptstore's
    counterpart of ``login(master=...)``."""
    set_default_session(Session(registry=registry, storage=storage))


def login(
    master: str | None = None,
    user: str | None = None,
    password: str | None = None,
    cert_path: str | None = None,
    cert_name: str | None = None,
    noverify: bool = False,
) -> None:
    """Accepted and ignored: there is no master. The client reads the registry and storage
    (``CKPTSTORE_REGISTRY`` / ``CKPTSTORE_STORAGE`` or :func:`configure`)."""
    if master is not None:
        logger.info(
            "client.login(master=%r) ignored: ckptstore reads its registry directly", master
        )


def logout() -> None:
    """Accepted and ignored (see :func:`login`)."""


def _sdk() -> Determined:
    # The process-wide session, read at each call so configure() applies to later calls.
    return Determined._over(default_session())


def get_checkpoint(uuid: str) -> Checkpoint:
    """The checkpoint with this UUID (:meth:`Determined.get_checkpoint`)."""
    return _sdk().get_checkpoint(uuid)


def get_trial(trial_id: int) -> Trial:
    """The trial (:meth:`Determined.get_trial`)."""
    return _sdk().get_trial(trial_id)


def get_experiment(experiment_id: int) -> Experiment:
    """The experiment (:meth:`Determined.get_experiment`)."""
    return _sdk().get_experiment(experiment_id)


def list_experiments(
    sort_by: TrialSortBy | None = None,
    order_by: OrderBy | None = None,
    experiment_ids: list[int] | None = None,
    labels: list[str] | None = None,
    users: list[str] | None = None,
    states: list[ExperimentState] | None = None,
    name: str | None = None,
    project_id: int | None = None,
) -> list[Experiment]:
    """Experiments, filtered (:meth:`Determined.list_experiments`)."""
    return _sdk().list_experiments(
        sort_by, order_by, experiment_ids, labels, users, states, name, project_id
    )


def create_model(
    name: str, description: str | None = "", metadata: dict[str, Any] | None = None
) -> Model:
    """Register a new model (:meth:`Determined.create_model`)."""
    return _sdk().create_model(name, description, metadata)


def get_model(identifier: str | int) -> Model:
    """The registered model named ``identifier``."""
    return _sdk().get_model(identifier)


def get_model_by_id(model_id: int) -> Model:
    """Models are identified by name here; ``model_id`` is the name (as ``Model.model_id``)."""
    return _sdk().get_model_by_id(model_id)


def list_models(
    sort_by: ModelSortBy = ModelSortBy.NAME,
    order_by: OrderBy = OrderBy.ASCENDING,
    name: str | None = None,
    description: str | None = None,
    model_id: int | None = None,
    workspace_names: list[str] | None = None,
    workspace_ids: list[int] | None = None,
) -> list[Model]:
    """Registered models (not archived), filtered by name/description substrings."""
    return _sdk().list_models(
        sort_by, order_by, name, description, model_id, workspace_names, workspace_ids
    )


def get_models(
    sort_by: ModelSortBy = ModelSortBy.NAME,
    order_by: OrderBy = OrderBy.ASCENDING,
    name: str = "",
    description: str = "",
) -> list[Model]:
    """Determined's deprecated name for :func:`list_models`."""
    return _sdk().list_models(sort_by, order_by, name or None, description or None)


def get_model_labels() -> list[str]:
    """Every label used by a registered model, most used first."""
    return _sdk().get_model_labels()


def iter_trials_metrics(trial_ids: list[int], group: str) -> Iterator[TrialMetrics]:
    """Every ``group`` report of the trials, oldest first per trial."""
    return _sdk().iter_trials_metrics(trial_ids, group)


def stream_trials_metrics(trial_ids: list[int], group: str) -> Iterator[TrialMetrics]:
    """Determined's deprecated name for :func:`iter_trials_metrics`."""
    return _sdk().iter_trials_metrics(trial_ids, group)


def stream_trials_training_metrics(trial_ids: list[int]) -> Iterator[TrialMetrics]:
    return _sdk().iter_trials_metrics(trial_ids, "training")


def stream_trials_validation_metrics(trial_ids: list[int]) -> Iterator[TrialMetrics]:
    return _sdk().iter_trials_metrics(trial_ids, "validation")


create_experiment = not_supported(
    "client.create_experiment", "`ckptstore experiment create CONFIG MODEL_DIR`"
)
_NO_USERS = "the registry's database permissions (there are no ckptstore users)"
whoami = not_supported("client.whoami", _NO_USERS)
get_session_username = not_supported("client.get_session_username", _NO_USERS)
create_user = not_supported("client.create_user", _NO_USERS)
get_user_by_id = not_supported("client.get_user_by_id", _NO_USERS)
get_user_by_name = not_supported("client.get_user_by_name", _NO_USERS)
list_users = not_supported("client.list_users", _NO_USERS)
_NO_WORKSPACES = "experiment names and model labels (there are no workspaces)"
create_workspace = not_supported("client.create_workspace", _NO_WORKSPACES)
delete_workspace = not_supported("client.delete_workspace", _NO_WORKSPACES)
get_workspace = not_supported("client.get_workspace", _NO_WORKSPACES)
list_workspaces = not_supported("client.list_workspaces", _NO_WORKSPACES)
add_oauth_client = not_supported("client.add_oauth_client", _NO_USERS)
list_oauth_clients = not_supported("client.list_oauth_clients", _NO_USERS)
remove_oauth_client = not_supported("client.remove_oauth_client", _NO_USERS)

__all__ = [
    "Checkpoint",
    "CheckpointOrderBy",
    "CheckpointSortBy",
    "CheckpointState",
    "Determined",
    "DownloadMode",
    "Experiment",
    "ExperimentOrderBy",
    "ExperimentSortBy",
    "ExperimentState",
    "Model",
    "ModelOrderBy",
    "ModelSortBy",
    "ModelVersion",
    "OrderBy",
    "TrainingMetrics",
    "Trial",
    "TrialMetrics",
    "TrialOrderBy",
    "TrialSortBy",
    "TrialState",
    "ValidationMetrics",
    "configure",
    "create_experiment",
    "create_model",
    "get_checkpoint",
    "get_experiment",
    "get_model",
    "get_model_by_id",
    "get_model_labels",
    "get_models",
    "get_trial",
    "iter_trials_metrics",
    "list_experiments",
    "list_models",
    "login",
    "logout",
    "stream_trials_metrics",
    "stream_trials_training_metrics",
    "stream_trials_validation_metrics",
]
