"""Names the runner and its trial processes share (no TensorFlow import).

Example::

    from ckptstore.keras_io.experiment.common import experiment_config

    raw = experiment_config(registry, 3)   # the user's YAML config as a dict
"""

from __future__ import annotations

from typing import Any

MODEL_DIR_ENV = "CKPTSTORE_MODEL_DIR"
OPTUNA_TRIAL_ENV = "CKPTSTORE_OPTUNA_TRIAL"
#: Key of the experiment config (as stored in the registry) holding runner settings.
RUNNER_KEY = "_ckptstore"


def experiment_config(registry: Any, experiment_id: int) -> dict[str, Any]:
    """The user's config of an experiment, without the runner's own key."""
    raw = dict(registry.get_experiment(experiment_id).config or {})
    raw.pop(RUNNER_KEY, None)
    return raw
