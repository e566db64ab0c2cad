"""The run-environment contract between a launcher and the process it starts, by its public name.

The experiment runner (local or on Ray), ``ckptstore job run`` and ``ckptstore run`` start user
code with these environment variables; ``core.init``, the TFKerasTrial worker and
``det.get_cluster_info()`` read them. The code lives in ``ckptstore.core``'s private modules;
this is the list other packages import.

Example::

    from ckptstore.core import info

    trial_id = info.parse_int_env(info.TRIAL_ID_ENV)   # None outside a trial
    cluster = info.get_trial_info()
"""

from __future__ import annotations

from ckptstore.core._distributed import TF_CONFIG_ENV, parse_tf_config, shard_batch_size
from ckptstore.core._info import (
    ALL_ENV,
    DATA_CONFIG_ENV,
    DIST_PORT_ENV,
    EXPERIMENT_ID_ENV,
    HPARAMS_ENV,
    JOB_ID_ENV,
    REGISTRY_ENV,
    STORAGE_ENV,
    TRIAL_ID_ENV,
    TRIAL_SEED_ENV,
    TRIAL_STATE_BY_ENV,
    ClusterInfo,
    TrialInfo,
    get_cluster_info,
    get_trial_info,
    lookup_latest_checkpoint,
    parse_int_env,
    parse_json_env,
    storage_from_env,
)
from ckptstore.core._searcher import ORACLE_ENV, SEARCHER_ENV

__all__ = [
    # the variables, as a launcher sets them
    "ALL_ENV",
    "DATA_CONFIG_ENV",
    "DIST_PORT_ENV",
    "EXPERIMENT_ID_ENV",
    "HPARAMS_ENV",
    "JOB_ID_ENV",
    "ORACLE_ENV",
    "REGISTRY_ENV",
    "SEARCHER_ENV",
    "STORAGE_ENV",
    "TF_CONFIG_ENV",
    "TRIAL_ID_ENV",
    "TRIAL_SEED_ENV",
    "TRIAL_STATE_BY_ENV",
    # reading them in the started process
    "ClusterInfo",
    "TrialInfo",
    "get_cluster_info",
    "get_trial_info",
    "lookup_latest_checkpoint",
    "parse_int_env",
    "parse_json_env",
    "parse_tf_config",
    "shard_batch_size",
    "storage_from_env",
]
