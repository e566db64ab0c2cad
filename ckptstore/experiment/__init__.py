"""Experiments: YAML configs, Optuna hyperparameter search and the local runner.

Example::

    from ckptstore.experiment import create_experiment, describe_experiment

    exp_id = create_experiment("const.yaml", "examples/mnist_tfkeras_trial")
    print(describe_experiment(exp_id)["best_metric"])
    schema = config_json_schema()   # the JSON Schema of a config, as the docs publish it
"""

from ckptstore.experiment.config import (
    ExperimentConfig,
    config_json_schema,
    load_config,
    parse_config,
)
from ckptstore.experiment.describe import describe_experiment, list_experiments
from ckptstore.experiment.runner import create_experiment, resume_experiment, run_experiment

__all__ = [
    "ExperimentConfig",
    "config_json_schema",
    "create_experiment",
    "describe_experiment",
    "list_experiments",
    "load_config",
    "parse_config",
    "resume_experiment",
    "run_experiment",
]
