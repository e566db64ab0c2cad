"""The Ray engine: an experiment's trials as Ray Tune trials on a Ray cluster.

``ckptstore experiment create CONFIG DIR --engine ray [--address ADDR]`` (and ``resume``) runs
the same experiment as the local runner, with Ray placing the trials on the cluster's nodes:

- The search stays the experiment's Optuna study (:mod:`.optuna_queue`): a Tune
  :class:`~ray.tune.search.Searcher` (:class:`QueueSearcher`) takes each trial's slot from that
  queue and tells the study the result, so ``random``/``grid``/``tpe`` propose what they
  propose locally and ``adaptive_asha`` prunes at the same rungs (the trial process asks the
  same Optuna pruner). The driver keeps Optuna's heartbeat for every trial it placed.
- Each Tune trial runs the trial's own process (``python -m ckptstore.keras_io.trial.worker``
  or the script entrypoint) on the node Ray picked, with the storage URL and registry in its
  environment, so checkpoints, metrics and GC go through ckptstore exactly as in a local run.
- A node lost mid-trial: the Tune trial fails and Tune runs it again (up to ``max_restarts``,
  Tune's ``FailureConfig.max_failures``) on a node that is alive; the trial process resumes
  from the trial's latest committed ckptstore checkpoint (same registry trial, same
  ``continue_id``). The driver lost: its trials lose their Optuna heartbeat, and ``ckptstore
  experiment resume ID --engine ray`` (or a local ``resume``/``join``) continues them.

Ray is an optional extra (``pip install ckptstore[ray]``); nothing here imports TensorFlow.
Model code must be at the same path on every node (a shared folder, or the same image).

Example::

    from ckptstore.experiment import create_experiment

    create_experiment("search.yaml", "model_dir", engine="ray", address="10.0.0.5:6379")
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.experiment.common import die_with_parent, trial_env
from ckptstore.experiment.config import ExperimentConfig
from ckptstore.experiment.optuna_queue import FINISHED, Claim, TrialQueue
from ckptstore.launch.process import child_command
from ckptstore.launch.tensorflow import SLOTS_ENV

#: A trial's final searcher metric by registry trial id (None when it reported none).
MetricOf = Callable[[int], float | None]

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.experiment.runner import ExperimentRun, RunOutcome

logger = logging.getLogger(__name__)

#: How often the driver re-queues trials whose runner lost its heartbeat (seconds).
REAP_S = 2.0
ENGINES = ("local", "ray")
#: Memory (bytes) the Tune trial that launches a multi-slot trial's Ray Train workers asks for.
LAUNCHER_MEMORY = 64 * 1024 * 1024


def _import_ray() -> Any:
    try:
        import ray
        import ray.tune
    except ImportError as exc:
        raise errors.InvalidConfig(
            "--engine ray needs Ray: install it with `pip install 'ckptstore[ray]'` (Ray Tune "
            f"and Ray Train). Received: ImportError {exc}."
        ) from None
    return ray


def check_config(config: ExperimentConfig) -> int:
    """What the Ray engine needs of a config (checked before anything is recorded or started);
    returns ``slots_per_trial``."""
    slots = config.slots_per_trial
    if slots > 1 and config.entrypoint.is_trial_class:
        # The TFKerasTrial controller trains in one process; N copies would each train alone.
        raise errors.NotSupported(
            "Several workers per trial with a TFKerasTrial entrypoint are not supported yet (the "
            "trial class trains in one process). Use a script entrypoint (`entrypoint: python3 "
            "train.py`) that builds its model under the strategy of "
            "`det.core.DistributedContext.from_tf_config()` (Ray sets TF_CONFIG for each "
            "worker), or slots_per_trial: 1. Received: resources.slots_per_trial="
            f"{slots} with entrypoint {config.entrypoint.module}:{config.entrypoint.attr}."
        )
    return slots


def _searcher_class() -> type:
    """The Tune searcher over the experiment's Optuna queue (a class made here, so this module
    imports without Ray): each suggestion is one claimed slot."""
    from ray.tune.search import Searcher

    class QueueSearcher(Searcher):
        def __init__(self, queue: TrialQueue, metric_of: MetricOf, script: bool) -> None:
            super().__init__()
            self.queue = queue
            self.metric_of = metric_of
            self.script = script  # a script's exit 0 completes its trial (as locally)
            self.claims: dict[str, Claim] = {}
            self._next_reap = 0.0

        def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
            if time.monotonic() >= self._next_reap:
                self._next_reap = time.monotonic() + REAP_S
                self.queue.reap()
            claim = self.queue.pop()
            if claim is None:
                if not self.claims and not self.queue.busy():
                    return Searcher.FINISHED
                return None  # other trials run (here or on other runners): ask again later
            self.claims[trial_id] = claim
            self.queue.registry.set_trial_state(claim.trial_id, "ACTIVE")
            logger.info(
                "Experiment %d: starting trial %d with %s on Ray",
                self.queue.experiment_id,
                claim.trial_id,
                claim.hparams,
            )
            # No secrets here: Tune writes a trial's config to its results folder.
            return {
                "trial_id": claim.trial_id,
                "hparams": claim.hparams,
                "optuna_id": claim.optuna_id if self.queue.searcher is not None else None,
            }

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            claim = self.claims.pop(trial_id, None)
            if claim is not None:
                _settle(
                    self.queue, claim, error=error, script=self.script, metric_of=self.metric_of
                )

        def hand_back(self) -> None:
            """The driver stops: every trial it placed goes back to the queue."""
            for claim in self.claims.values():
                self.queue.requeue(claim)
            self.claims.clear()

        # The queue (in the database) is the searcher's state: Tune's pickled copy (of its
        # own state, for its restore) is not needed to resume, and the queue's connections and
        # threads do not pickle.
        def __getstate__(self) -> dict[str, Any]:
            state = dict(self.__dict__)
            for key in ("queue", "metric_of", "claims"):
                state.pop(key, None)
            return state

        def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
            return None

        def restore_from_dir(self, checkpoint_dir: str) -> None:
            return None

    return QueueSearcher


def _settle(
    queue: TrialQueue, claim: Claim, *, error: bool, script: bool, metric_of: MetricOf
) -> None:
    """Record how a Tune trial ended, as the local runner does: a script's exit 0 completes
    it, an error fails it, a preempted trial goes back to the queue, a finished one is told to
    the study with its final searcher metric."""
    registry = queue.registry
    state = registry.get_trial(claim.trial_id).state
    if not error and script and state == "ACTIVE":
        registry.set_trial_state(claim.trial_id, "COMPLETED")
        state = "COMPLETED"
    if error:  # Tune gave up after max_failures
        registry.set_trial_state(claim.trial_id, "ERROR")
        queue.tell(claim, None)
    elif state not in FINISHED:  # preempted: any runner continues it
        queue.requeue(claim)
    else:
        queue.tell(claim, metric_of(claim.trial_id) if state == "COMPLETED" else None)
    logger.info(
        "Experiment %d: trial %d ended %s",
        queue.experiment_id,
        claim.trial_id,
        registry.get_trial(claim.trial_id).state,
    )


# ---- what runs on the cluster -------------------------------------------------------------------
def _run_trial_process(cmd: list[str], env: dict[str, str], cwd: str) -> None:
    """Run the trial's process here and wait; a non-zero exit fails the Tune trial (retried)."""
    rc = subprocess.call(
        cmd, cwd=cwd, env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None
    )
    if rc != 0:
        raise RuntimeError(f"trial process {cmd!r} exited with status {rc}")


def _train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: the trial process with the TF_CONFIG Ray set for this worker."""
    env = dict(config["env"])
    if "TF_CONFIG" in os.environ:
        env["TF_CONFIG"] = os.environ["TF_CONFIG"]
    # This worker is one of the trial's slots: Determined's launcher (`python3 -m
    # determined.launch.tensorflow -- ...`) must run the script once here, not N times.
    env[SLOTS_ENV] = "1"
    _run_trial_process(config["cmd"], env, config["cwd"])


def _tune_trial(config: dict[str, Any], spec: dict[str, Any]) -> None:
    """One Tune trial: the trial's process, or ``slots`` Ray Train TensorFlow workers."""
    env = trial_env(
        dict(os.environ),
        spec["experiment_env"],
        config["trial_id"],
        config["hparams"],
        config["optuna_id"],
    )
    if spec["slots"] == 1:
        _run_trial_process(spec["cmd"], env, spec["cwd"])
        return
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    trainer = TensorflowTrainer(
        _train_worker,
        train_loop_config={"cmd": spec["cmd"], "env": env, "cwd": spec["cwd"]},
        scaling_config=ScalingConfig(num_workers=spec["slots"], resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=f"ckptstore-trial-{config['trial_id']}",
            storage_path=spec["results"],
            # Tune retries the whole trial up to max_restarts (FailureConfig below in
            # run_on_ray); retrying here as well would allow (max_restarts + 1)^2 attempts.
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    trainer.fit()


# ---- the driver ---------------------------------------------------------------------------------
def run_on_ray(run: ExperimentRun, address: str | None) -> RunOutcome:
    """Run (or continue) ``run``'s experiment on the Ray cluster at ``address`` (``None``:
    ``RAY_ADDRESS``, else a local Ray started for this run)."""
    from ckptstore import defaults

    ray = _import_ray()
    from ray import tune

    config = run.config
    slots = check_config(config)
    if config.entrypoint.is_trial_class:
        cmd = [sys.executable, "-m", "ckptstore.keras_io.trial.worker"]
    else:
        cmd = child_command(config.entrypoint.command())
    results = str(defaults.home() / "ray_results")
    spec = {
        "experiment_env": run.experiment_env(),
        "cmd": cmd,
        "cwd": str(run.model_dir),
        "slots": slots,
        "results": results,
    }
    run.queue.ensure_slots()
    searcher = _searcher_class()(
        run.queue, run.final_metric, script=not config.entrypoint.is_trial_class
    )
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=address, log_to_driver=True, include_dashboard=False)
    # One worker of a multi-slot trial per CPU; the Tune trial that launches them takes no CPU
    # (Tune refuses an empty request, so it asks for a little memory instead).
    resources = {"CPU": 1} if slots == 1 else {"CPU": 0, "memory": LAUNCHER_MEMORY}
    trainable = tune.with_resources(tune.with_parameters(_tune_trial, spec=spec), resources)
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=-1,
            max_concurrent_trials=config.searcher.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=f"ckptstore-experiment-{run.experiment_id}-{int(time.time())}",
            storage_path=results,
            failure_config=tune.FailureConfig(max_failures=config.max_restarts),
            verbose=0,
        ),
    )
    logger.info(
        "Experiment %d on Ray (%s): %d slot(s) per trial",
        run.experiment_id,
        address or os.environ.get("RAY_ADDRESS") or "local",
        slots,
    )
    try:
        tuner.fit()
    finally:
        searcher.hand_back()
        if started_ray:
            ray.shutdown()
    return run.conclude(stopped=False)


__all__ = ["ENGINES", "check_config", "run_on_ray"]
