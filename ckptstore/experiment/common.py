"""Names the runner and its trial processes share, and the one builder of the environment of
every process ckptstore starts for user code (no TensorFlow import).

Example::

    from ckptstore.experiment.common import experiment_config

    raw = experiment_config(registry, 3)   # the user's YAML config as a dict
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import defaults
from ckptstore.core import info as trial_info
from ckptstore.launch.process import child_command, child_env
from ckptstore.launch.tensorflow import SLOTS_ENV

if TYPE_CHECKING:
    from ckptstore.experiment.config import ExperimentConfig
    from ckptstore.registry import Registry
    from ckptstore.storage_backends.spec import StorageConfig

MODEL_DIR_ENV = "CKPTSTORE_MODEL_DIR"
OPTUNA_TRIAL_ENV = "CKPTSTORE_OPTUNA_TRIAL"
#: Key of the experiment config (as stored in the registry) holding runner settings.
RUNNER_KEY = "_ckptstore"


def runner_set_env() -> frozenset[str]:
    """The variables the runner sets in every trial process (from the experiment and the
    trial): ``environment.environment_variables`` may not name them."""
    return frozenset(
        {trial_info.TRIAL_ID_ENV, trial_info.EXPERIMENT_ID_ENV, trial_info.HPARAMS_ENV}
        | {trial_info.DATA_CONFIG_ENV, trial_info.STORAGE_ENV, trial_info.REGISTRY_ENV}
        | {trial_info.JOB_ID_ENV, MODEL_DIR_ENV, OPTUNA_TRIAL_ENV, SLOTS_ENV}
        | {trial_info.SEARCHER_ENV, trial_info.ORACLE_ENV}
    )


#: The module one TFKerasTrial worker process runs (it reads its trial from the environment).
TRIAL_WORKER_MODULE = "ckptstore.keras_io.trial.worker"


def trial_command(config: ExperimentConfig, *, launcher: bool = False) -> list[str]:
    """The command of one trial process: the user's script (a bare ``python`` runs under
    ckptstore's interpreter), or the TFKerasTrial worker. ``launcher=True`` (the local runner)
    puts a TFKerasTrial with ``slots_per_trial: N > 1`` under Determined's TensorFlow launcher,
    which starts its N workers with their TF_CONFIG, as a script's entrypoint does itself; Ray
    Train starts the workers of the Ray engine instead."""
    if not config.entrypoint.is_trial_class:
        return child_command(config.entrypoint.command())
    worker = [sys.executable, "-m", TRIAL_WORKER_MODULE]
    if launcher and config.slots_per_trial > 1:
        return [sys.executable, "-m", "ckptstore.launch.tensorflow", "--", *worker]
    return worker


def experiment_config(registry: Registry, experiment_id: int) -> dict[str, Any]:
    """The user's config of an experiment, without the runner's own key."""
    raw = dict(registry.get_experiment(experiment_id).config or {})
    raw.pop(RUNNER_KEY, None)
    return raw


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_process_env(
    base: Mapping[str, str],
    settings: Mapping[str, str | None],
    *,
    model_dir: str,
    who: str,
) -> dict[str, str]:
    """The environment of a process ckptstore starts for user code, built here only (trials
    locally and on Ray, jobs, ``ckptstore run``): ``base`` (the launching process's),
    ``settings`` on top (None removes a key), then the ``determined`` alias and ``model_dir``
    first on PYTHONPATH. ``who`` names the launcher in the alias's warning."""
    env = dict(base)
    for key, value in settings.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return child_env(env, extra_paths=[model_dir], who=who)


def run_settings(
    *,
    data: Mapping[str, Any] | None = None,
    storage: StorageConfig | None = None,
    registry_url: str | None = None,
    slots: int | None = None,
) -> dict[str, str]:
    """The keys a launched process reads (:mod:`ckptstore.core.info`) for what is given:
    its ``data`` config, checkpoint storage, registry and worker count."""
    settings: dict[str, str] = {}
    if data is not None:
        settings[trial_info.DATA_CONFIG_ENV] = json.dumps(dict(data))
    if storage is not None:
        settings[trial_info.STORAGE_ENV] = storage.to_env()
    if registry_url is not None:
        settings[trial_info.REGISTRY_ENV] = registry_url
    if slots is not None:
        settings[SLOTS_ENV] = str(slots)
    return settings


def trial_env(
    base: Mapping[str, str],
    experiment_env: Mapping[str, str],
    trial_id: int,
    hparams: dict[str, Any],
    optuna_id: int | None,
) -> dict[str, str]:
    """A trial process's environment: ``base`` (the launching process's), the experiment's
    settings (:meth:`~ckptstore.experiment.runner.ExperimentRun.experiment_env`), the trial's
    id, hparams and Optuna trial. The local runner and the Ray engine launch trials with it."""
    settings: dict[str, str | None] = dict(experiment_env)
    settings[trial_info.JOB_ID_ENV] = None  # a trial is no job, whatever its node's shell had
    settings[trial_info.TRIAL_ID_ENV] = str(trial_id)
    settings[trial_info.HPARAMS_ENV] = json.dumps(hparams)
    settings[OPTUNA_TRIAL_ENV] = None if optuna_id is None else str(optuna_id)
    # The runner records how the trial ended (restarts, re-queueing): core.init must not.
    settings[trial_info.TRIAL_STATE_BY_ENV] = "ckptstore experiment"
    return child_process_env(
        base, settings, model_dir=experiment_env[MODEL_DIR_ENV], who="ckptstore experiment"
    )


def registry_url(registry: Registry | str | None) -> str:
    """The registry's URL with its password (for child processes), from a URL, None or Registry."""
    if registry is None:
        return defaults.default_registry_url()
    if isinstance(registry, str):
        return registry
    db = getattr(registry, "_db", None)
    engine = getattr(db, "engine", None)
    if engine is not None:
        return engine.url.render_as_string(hide_password=False)
    return str(registry.url)


def open_registry(registry: Registry | str | None) -> tuple[Any, bool]:
    from ckptstore.registry import Registry

    if isinstance(registry, Registry):
        return registry, False
    return Registry(registry_url(registry)), True
