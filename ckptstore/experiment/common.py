"""Names the runner and its trial processes share (no TensorFlow import).

Example::

    from ckptstore.experiment.common import experiment_config

    raw = experiment_config(registry, 3)   # the user's YAML config as a dict
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
from typing import TYPE_CHECKING, Any

from ckptstore.core import _info as trial_info

if TYPE_CHECKING:
    from ckptstore.registry import Registry

MODEL_DIR_ENV = "CKPTSTORE_MODEL_DIR"
OPTUNA_TRIAL_ENV = "CKPTSTORE_OPTUNA_TRIAL"
#: Key of the experiment config (as stored in the registry) holding runner settings.
RUNNER_KEY = "_ckptstore"


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


def trial_env(
    base: dict[str, str],
    experiment_env: dict[str, str],
    trial_id: int,
    hparams: dict[str, Any],
    optuna_id: int | None,
) -> dict[str, str]:
    """A trial process's environment: ``base`` (the launching process's), the experiment's
    settings, the trial's id, hparams and Optuna trial, and the model folder first on
    PYTHONPATH. The local runner and the Ray engine launch trials with it."""
    env = dict(base)
    env.update(experiment_env)
    env[trial_info.TRIAL_ID_ENV] = str(trial_id)
    env[trial_info.HPARAMS_ENV] = json.dumps(hparams)
    if optuna_id is not None:
        env[OPTUNA_TRIAL_ENV] = str(optuna_id)
    else:
        env.pop(OPTUNA_TRIAL_ENV, None)
    pythonpath = [experiment_env[MODEL_DIR_ENV]] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return env
