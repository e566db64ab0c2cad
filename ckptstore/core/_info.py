"""Which trial this process belongs to, read from the environment (Determined's ``ClusterInfo``).

The experiment runner (and any launcher) starts a training script with the environment variables
named below; :func:`get_trial_info` turns them into an object shaped like Determined's
``det.get_cluster_info()``. This module never imports TensorFlow.

Example::

    import ckptstore as det

    info = det.get_cluster_info()
    if info is not None:
        print(info.trial.trial_id, info.trial.hparams, info.latest_checkpoint)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import defaults, errors
from ckptstore.jsonsafe import env_json_object

if TYPE_CHECKING:
    from ckptstore.registry import Registry

logger = logging.getLogger(__name__)

#: The trial id (an integer) of the running trial.
TRIAL_ID_ENV = "CKPTSTORE_TRIAL_ID"
#: The experiment id (an integer) the trial belongs to, if any.
EXPERIMENT_ID_ENV = "CKPTSTORE_EXPERIMENT_ID"
#: The trial's hyperparameters, a JSON object.
HPARAMS_ENV = "CKPTSTORE_HPARAMS"
#: The experiment config's ``data`` section, a JSON object (``context.config_data``).
DATA_CONFIG_ENV = "CKPTSTORE_DATA_CONFIG"
#: The storage URL or a JSON ``checkpoint_storage`` dict (same variable as ``ckptstore.defaults``).
STORAGE_ENV = defaults.STORAGE_ENV
#: The registry URL (same variable as ``ckptstore.defaults``).
REGISTRY_ENV = defaults.REGISTRY_ENV
#: The id of the job (``ckptstore job run``) this process belongs to; set instead of a trial id.
JOB_ID_ENV = "CKPTSTORE_JOB_ID"
#: Overrides the TCP port of the cross-worker channel (see ``ckptstore.core.DistributedContext``).
DIST_PORT_ENV = "CKPTSTORE_DIST_PORT"
#: The trial's seed (``info.trial.trial_seed``); default: the trial id.
TRIAL_SEED_ENV = "CKPTSTORE_TRIAL_SEED"

#: Set by a launcher that records how its trials end (``ckptstore experiment``, local or Ray):
#: ``core.init`` then leaves the trial's state to it instead of setting it on exit.
TRIAL_STATE_BY_ENV = "CKPTSTORE_TRIAL_STATE_BY"

#: Every variable the runner may set, for launchers that copy them into worker processes.
ALL_ENV = (
    TRIAL_ID_ENV,
    EXPERIMENT_ID_ENV,
    HPARAMS_ENV,
    DATA_CONFIG_ENV,
    STORAGE_ENV,
    REGISTRY_ENV,
    DIST_PORT_ENV,
    TRIAL_SEED_ENV,
    JOB_ID_ENV,
    TRIAL_STATE_BY_ENV,
)


def parse_int_env(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The integer in env var ``name``, None when unset or empty.

    Raises :class:`~ckptstore.errors.InvalidConfig` naming the variable when it is not an integer.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.InvalidConfig(
            f"Environment variable {name} must be an integer id. Received: {name}={raw!r}. "
            f"Unset it or set it to the numeric id."
        ) from None


def parse_json_env(name: str, environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The JSON object in env var ``name``, None when unset or empty.

    Raises :class:`~ckptstore.errors.InvalidConfig` naming the variable when it is not a JSON
    object.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    return env_json_object(raw, name)


def storage_from_env(environ: Mapping[str, str] | None = None) -> str | dict[str, Any] | None:
    """``CKPTSTORE_STORAGE`` as a URL, or as a dict when it holds a JSON object; None if unset
    (:class:`~ckptstore.storage_backends.config.StorageConfig` parses it)."""
    from ckptstore.storage_backends.spec import env_storage

    return env_storage(environ)


@dataclasses.dataclass
class TrialInfo:
    """The trial part of :class:`ClusterInfo` (Determined's ``info.trial``).

    ``trial_seed`` defaults to ``CKPTSTORE_TRIAL_SEED`` when a launcher sets it, else to the
    trial id (a choice: stable across restarts of the trial and different between trials, which
    is what Determined's seed gave). ``trial_run_id`` is 1 (no master counts restarts) and
    ``config`` the experiment config when the trial was started by an experiment.

    Example::

        info = TrialInfo(trial_id=3, hparams={"lr": 0.1})
        assert info.trial_seed == 3
    """

    trial_id: int
    experiment_id: int | None = None
    hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    trial_seed: int | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    trial_run_id: int = 1
    debug: bool = False

    def __post_init__(self) -> None:
        if self.trial_seed is None:
            env_seed = parse_int_env(TRIAL_SEED_ENV)
            self.trial_seed = int(self.trial_id) if env_seed is None else env_seed


_NOT_LOOKED_UP = object()


class ClusterInfo:
    """What Determined's ``det.get_cluster_info()`` returns, for a trial run by ckptstore.

    ``latest_checkpoint`` is looked up in the registry on first access (and cached), so creating
    the object never touches the database; pass ``latest_checkpoint=`` (even None) to fix it.

    Example::

        info = ClusterInfo(TrialInfo(trial_id=3, hparams={"lr": 0.1}), registry="sqlite:///r.db")
        info.trial.hparams["lr"], info.latest_checkpoint
    """

    task_type = "TRIAL"

    def __init__(
        self,
        trial: TrialInfo,
        *,
        storage: str | dict[str, Any] | None = None,
        registry: Registry | str | None = None,
        data_config: dict[str, Any] | None = None,
        latest_checkpoint: str | None | object = _NOT_LOOKED_UP,
    ) -> None:
        self.trial = trial
        self.storage = storage
        self.registry = registry
        self.data_config = dict(data_config or {})
        self._looked_up = latest_checkpoint is not _NOT_LOOKED_UP
        self._latest: str | None = None if not self._looked_up else latest_checkpoint  # type: ignore[assignment]

    @property
    def hparams(self) -> dict[str, Any]:
        """The trial's hyperparameters (same dict as ``trial.hparams``)."""
        return self.trial.hparams

    @property
    def cluster_id(self) -> str:
        """A stable id of the registry this trial is recorded in (Determined's cluster id names
        the master): a UUID derived from the registry URL, so every process of one setup agrees."""
        url = (
            getattr(self.registry, "url", None) or self.registry or defaults.default_registry_url()
        )
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"ckptstore-registry:{url}"))

    # What Determined's cluster told a task about its place on the cluster. There is no master
    # or agent here, so these are the values of a task that owns no slots (a script reading
    # them does not fail; nothing should be inferred from them).
    master_url = ""
    master_cert_name: str | None = None
    master_cert_file: str | None = None
    agent_id = ""
    session_token = ""
    container_rank = 0

    @property
    def task_id(self) -> str:
        """``trial-<id>``: names this trial's task (Determined's task ids were opaque)."""
        return f"trial-{self.trial.trial_id}"

    @property
    def allocation_id(self) -> str:
        return f"{self.task_id}.{self.trial.trial_run_id}"

    @property
    def slot_ids(self) -> list[int]:
        return []

    @property
    def gpu_uuids(self) -> list[str]:
        return []

    @property
    def container_addrs(self) -> list[str]:
        return []

    @property
    def container_slot_counts(self) -> list[int]:
        return []

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's ``data`` section (Determined's ``info.user_data``)."""
        return self.data_config

    @property
    def latest_checkpoint(self) -> str | None:
        """UUID of the trial's newest committed checkpoint, or None when it has none yet."""
        if not self._looked_up:
            self._latest = lookup_latest_checkpoint(
                self.trial.trial_id, self.registry, storage=self.storage
            )
            self._looked_up = True
        return self._latest

    def __repr__(self) -> str:
        return (
            f"ClusterInfo(task_type={self.task_type!r}, trial_id={self.trial.trial_id}, "
            f"experiment_id={self.trial.experiment_id})"
        )


def lookup_latest_checkpoint(
    trial_id: int,
    registry: Registry | str | None = None,
    *,
    storage: str | Mapping[str, Any] | None = None,
) -> str | None:
    """The newest committed checkpoint UUID of ``trial_id`` in ``registry`` (a Registry, a URL, or
    None for the default registry); None when the trial is unknown or has no checkpoint. With
    ``storage`` (a URL or dict), a checkpoint whose manifest is gone from it is skipped (the
    newest that exists is taken, with a warning)."""
    from ckptstore.checkpointing.reconcile import newest_in_storage
    from ckptstore.checkpointing.scan import sort_records
    from ckptstore.registry import Registry, open_registry
    from ckptstore.storage_backends.spec import StorageConfig

    owned = not isinstance(registry, Registry)
    reg = open_registry(registry)
    try:
        records = reg.checkpoint_records(trial_id=trial_id)
        if not records:
            return None
        newest_first = list(reversed(sort_records(records)))
        if storage is None:
            return newest_first[0].uuid
        store = StorageConfig.parse(storage).open()
        try:
            found = newest_in_storage(store, newest_first, trial_id=trial_id)
        finally:
            store.close()
        return found.uuid if found is not None else None
    finally:
        if owned:
            reg.close()


def get_trial_info(environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """Read the running trial from the environment; None when this process is not in a trial.

    A process is in a trial when ``CKPTSTORE_TRIAL_ID`` is set. Hyperparameters come from
    ``CKPTSTORE_HPARAMS`` (JSON), storage and registry from ``CKPTSTORE_STORAGE`` and
    ``CKPTSTORE_REGISTRY`` (defaults from :mod:`ckptstore.defaults` when unset).

    Example::

        import ckptstore as det

        info = det.get_cluster_info()
        assert info and info.task_type == "TRIAL", "run this as a trial"
        checkpoint, continue_id = info.latest_checkpoint, info.trial.trial_id
    """
    environ = os.environ if environ is None else environ
    trial_id = parse_int_env(TRIAL_ID_ENV, environ)
    if trial_id is None:
        return None
    trial = TrialInfo(
        trial_id=trial_id,
        experiment_id=parse_int_env(EXPERIMENT_ID_ENV, environ),
        hparams=parse_json_env(HPARAMS_ENV, environ) or {},
    )
    return ClusterInfo(
        trial,
        storage=storage_from_env(environ),
        registry=environ.get(REGISTRY_ENV) or None,
        data_config=parse_json_env(DATA_CONFIG_ENV, environ),
    )


#: Determined's name for :func:`get_trial_info`.
get_cluster_info = get_trial_info

__all__ = [
    "ALL_ENV",
    "ClusterInfo",
    "DATA_CONFIG_ENV",
    "DIST_PORT_ENV",
    "EXPERIMENT_ID_ENV",
    "HPARAMS_ENV",
    "REGISTRY_ENV",
    "STORAGE_ENV",
    "TRIAL_ID_ENV",
    "TRIAL_SEED_ENV",
    "TrialInfo",
    "get_cluster_info",
    "get_trial_info",
    "lookup_latest_checkpoint",
]
