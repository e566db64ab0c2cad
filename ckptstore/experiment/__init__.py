"""Experiments: YAML configs, Optuna hyperparameter search and the local runner.

Example::

    from ckptstore.experiment import create_experiment, describe_experiment

    exp_id = create_experiment("const.yaml", "examples/mnist_tfkeras_trial")
    print(describe_experiment(exp_id)["best_metric"])
"""

from ckptstore.experiment.config import ExperimentConfig, load_config, parse_config
from ckptstore.experiment.runner import (
    create_experiment,
    describe_experiment,
    list_experiments,
    resume_experiment,
    run_experiment,
)

__all__ = [
    "ExperimentConfig",
    "create_experiment",
    "describe_experiment",
    "list_experiments",
    "load_config",
    "parse_config",
    "resume_experiment",
    "run_experiment",
]
