"""The Ray engine: an experiment's trials as Ray Tune trials on a Ray cluster.

``ckptstore experiment create CONFIG DIR --engine ray [--address ADDR]`` (and ``resume``) runs
the same experiment as the local runner, with Ray placing the trials on the cluster's nodes:

- The search stays the experiment's Optuna study (:mod:`.optuna_queue`): a Tune
  :class:`~ray.tune.search.Searcher` (:class:`QueueSearcher`) takes each trial's slot from that
  queue and tells the study the result, so ``random``/``grid``/``tpe`` propose what they
  propose locally and ``adaptive_asha`` prunes at the same rungs (the trial process asks the
  same Optuna pruner). The driver keeps Optuna's heartbeat for every trial it placed.
- Each Tune trial runs the trial's own process (``python -m ckptstore.keras_io.trial.worker``
  or the script entrypoint) on the node Ray picked. Everything the trial needs travels with
  it in the Tune trial's arguments (:meth:`ExperimentRun.experiment_env`: registry URL,
  storage spec, experiment id, data config, searcher settings, model folder and the config's
  ``environment.environment_variables``), whatever the driver's or the node's environment, so
  checkpoints, metrics and GC go through ckptstore exactly as in a local run. Nodes on other
  hosts than the driver's (:mod:`.reach`) need a registry and storage they can open: a SQLite
  file or a local folder is refused before any trial starts.
- SIGTERM or Ctrl-C to the driver: no new trial starts, every running trial process gets
  SIGTERM (through a small Ray actor its Tune trial polls), checkpoints and exits as it does
  locally, and the experiment is left PAUSED; ``ckptstore experiment resume ID --engine ray``
  continues it. A second signal ends the driver at once.
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

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.experiment.common import die_with_parent, trial_command, trial_env
from ckptstore.experiment.config import ExperimentConfig
from ckptstore.experiment.optuna_queue import FINISHED, Claim, TrialQueue
from ckptstore.experiment.reach import check_reachable
from ckptstore.launch.tensorflow import SLOTS_ENV
from ckptstore.masking import mask_text

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
#: How often a Tune trial asks whether the driver was told to stop (seconds).
STOP_POLL_S = 1.0


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
    returns ``slots_per_trial``: that many Ray Train workers per trial, each running the
    script, or the TFKerasTrial worker under MultiWorkerMirroredStrategy, with its TF_CONFIG."""
    return config.slots_per_trial


def _searcher_class() -> type:
    """The Tune searcher over the experiment's Optuna queue (a class made here, so this module
    imports without Ray): each suggestion is one claimed slot."""
    from ray.tune.search import Searcher

    class QueueSearcher(Searcher):
        def __init__(
            self,
            queue: TrialQueue,
            metric_of: MetricOf,
            script: bool,
            stopping: threading.Event,
        ) -> None:
            super().__init__()
            self.queue = queue
            self.metric_of = metric_of
            self.script = script  # a script's exit 0 completes its trial (as locally)
            self.stopping = stopping  # set by SIGTERM/SIGINT to the driver
            self.claims: dict[str, Claim] = {}
            self._next_reap = 0.0

        def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
            if self.stopping.is_set():
                return Searcher.FINISHED  # Tune waits for the running trials to pause
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
                    self.queue,
                    claim,
                    error=error,
                    script=self.script,
                    metric_of=self.metric_of,
                    stopping=self.stopping.is_set(),
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
            for key in ("queue", "metric_of", "claims", "stopping"):
                state.pop(key, None)
            return state

        def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
            return None

        def restore_from_dir(self, checkpoint_dir: str) -> None:
            return None

    return QueueSearcher


def _settle(
    queue: TrialQueue,
    claim: Claim,
    *,
    error: bool,
    script: bool,
    metric_of: MetricOf,
    stopping: bool = False,
) -> None:
    """Record how a Tune trial ended, as the local runner does: a script's exit 0 completes
    it (pauses it when the driver was told to stop: it checkpointed on SIGTERM), an error
    fails it, a preempted trial goes back to the queue, a finished one is told to the study
    with its final searcher metric."""
    registry = queue.registry
    state = registry.get_trial(claim.trial_id).state
    if not error and state == "ACTIVE" and (script or stopping):
        state = "PAUSED" if stopping else "COMPLETED"
        registry.set_trial_state(claim.trial_id, state)
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
def _stop_flag_class() -> Any:
    """The driver's "stop" switch, as a Ray actor every Tune trial can ask (a class made here,
    so this module imports without Ray). It lives on the head node, which the cluster cannot
    lose without ending the run anyway, and takes no CPU from the trials."""
    import ray

    @ray.remote(num_cpus=0, resources={"node:__internal_head__": 0.001})
    class StopFlag:
        def __init__(self) -> None:
            self._set = False

        def set(self) -> None:
            self._set = True

        def is_set(self) -> bool:
            return self._set

    return StopFlag


def _stop_requested(stop: Any) -> bool:
    import ray

    try:
        return bool(ray.get(stop.is_set.remote(), timeout=30))
    except Exception as exc:  # noqa: BLE001 - an unreachable flag must not fail the trial
        logger.warning("Could not ask the driver's stop flag (%s); the trial goes on", exc)
        return False


def _run_trial_process(cmd: list[str], env: dict[str, str], cwd: str, stop: Any) -> None:
    """Run the trial's process here and wait; a non-zero exit fails the Tune trial (retried).
    When the driver is told to stop, the process gets SIGTERM (core's preemption signal: it
    checkpoints and exits) and whatever it exits with, the Tune trial ends without a retry."""
    if _stop_requested(stop):
        return  # placed while the driver was stopping: the trial stays queued
    logs, trial_id = _node_logs(env)
    # Teed to this node's stdout (Ray's worker log) and to <storage>/logs/<trial id>/, where the
    # driver's failure message reads its last error lines as a local runner's does.
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
        stdout=subprocess.PIPE if logs is not None else None,
        stderr=subprocess.STDOUT if logs is not None else None,
    )
    if logs is not None:
        logs.follow(trial_id, proc)
    stopped, tail = False, ""
    try:
        while True:
            try:
                rc = proc.wait(timeout=STOP_POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if not stopped and _stop_requested(stop):
                logger.info("The driver stops: asking trial process %d to checkpoint", proc.pid)
                proc.send_signal(signal.SIGTERM)
                stopped = True
    finally:
        if logs is not None:
            tail = logs.close(trial_id)
            logs.close_all()
    if rc != 0 and not stopped:
        raise RuntimeError(f"trial process {cmd!r} exited with status {rc}:\n{tail}")


def _node_logs(env: dict[str, str]) -> tuple[Any, int]:
    """The trial logs writer of a trial process started on this node (its storage and trial id
    come with the trial's environment), or ``(None, 0)`` when they cannot be had: the log is
    a secondary artifact and never keeps a trial from running."""
    from ckptstore.core.info import STORAGE_ENV, TRIAL_ID_ENV
    from ckptstore.experiment.trial_logs import TrialLogs
    from ckptstore.storage_backends.spec import StorageConfig

    try:
        config = StorageConfig.from_env(env)
        trial_id = int(env[TRIAL_ID_ENV])
    except (KeyError, ValueError, errors.CkptstoreError) as exc:
        logger.warning("Trial output is not stored (%s: %s)", STORAGE_ENV, exc)
        return None, 0
    if config is None:
        return None, 0
    logs = TrialLogs(config, f"ray-{socket.gethostname()}-{os.getpid()}")
    return (logs, trial_id) if logs.ready() else (None, 0)


#: Ray Train's TensorFlow backend sets this in its workers' environment (it picks Keras 2 for
#: them); the trial's Keras is the user's choice (environment.environment_variables), as locally.
RAY_TRAIN_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def _node_env(
    spec: dict[str, Any], config: dict[str, Any], drop: tuple[str, ...] = ()
) -> dict[str, str]:
    """The trial process's environment on this node: the node's own (PATH, its Python's
    folders) without ``drop``, then everything the driver sent (never inherited from the
    driver)."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return trial_env(
        base,
        spec["experiment_env"],
        config["trial_id"],
        config["hparams"],
        config["optuna_id"],
    )


def _train_worker(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker: the trial process with the TF_CONFIG Ray set for this worker."""
    import ray

    # The trial's settings (registry password, environment_variables) come through the object
    # store: Ray Train writes train_loop_config itself to its results folder.
    spec, config = ray.get(loop_config["trial"])
    env = _node_env(spec, config, drop=(RAY_TRAIN_KERAS_ENV,))
    if "TF_CONFIG" in os.environ:
        env["TF_CONFIG"] = os.environ["TF_CONFIG"]
    # This worker is one of the trial's slots: Determined's launcher (`python3 -m
    # determined.launch.tensorflow -- ...`) must run the script once here, not N times.
    env[SLOTS_ENV] = "1"
    _run_trial_process(spec["cmd"], env, spec["cwd"], spec["stop"])


def _tune_trial(config: dict[str, Any], spec: dict[str, Any]) -> None:
    """One Tune trial: the trial's process, or ``slots`` Ray Train TensorFlow workers."""
    if spec["slots"] == 1:
        _run_trial_process(spec["cmd"], _node_env(spec, config), spec["cwd"], spec["stop"])
        return
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    trainer = TensorflowTrainer(
        _train_worker,
        train_loop_config={"trial": ray.put((spec, config))},
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
def other_hosts(ray: Any) -> set[str]:
    """Hostnames of the cluster's live nodes other than this machine's (see :mod:`.reach`)."""
    here = socket.gethostname()
    names = {n.get("NodeManagerHostname") or "" for n in ray.nodes() if n.get("Alive")}
    return {name for name in names if name != here}


class _DriverStop:
    """SIGTERM/SIGINT to the driver: ``stopping`` is set, and a thread (Ray calls do not belong
    in a signal handler) sets the cluster-wide stop flag the Tune trials poll. A second signal
    meets the previous handlers again (Ctrl-C twice ends the driver at once)."""

    def __init__(self, flag: Any) -> None:
        self.flag = flag
        self.stopping = threading.Event()
        self.signum: int | None = None  # the signal that stopped the driver
        self._wake = threading.Event()
        self._old: dict[int, Any] = {}
        self._thread = threading.Thread(target=self._tell, name="ckptstore-ray-stop", daemon=True)

    def __enter__(self) -> _DriverStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._on_signal)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()
        self._wake.set()
        self._thread.join(timeout=35)

    def _restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning("Received signal %d: trials checkpoint and pause", signum)
        self.signum = self.signum or signum
        self.stopping.set()
        self._wake.set()
        self._restore()

    def _tell(self) -> None:
        import ray

        self._wake.wait()
        if self.stopping.is_set():
            ray.get(self.flag.set.remote(), timeout=30)


def _connect(ray: Any, run: ExperimentRun, address: str | None) -> None:
    """``ray.init`` the cluster at ``address`` (or ``RAY_ADDRESS``). A ``host:port`` nobody
    answers on is found first by a plain TCP connect: Ray's own client ends the whole process
    when its GCS does not answer, which would leave the experiment ACTIVE with a C++ log line.
    Either failure pauses the experiment and raises ExperimentNotCompleted saying what to do."""
    target = address or os.environ.get("RAY_ADDRESS") or ""
    host, _, port = target.rpartition(":")
    try:
        if host and "://" not in target and port.isdigit():
            socket.create_connection((host, int(port)), timeout=10).close()
        ray.init(address=address, log_to_driver=True, include_dashboard=False)
    except (OSError, ConnectionError, RuntimeError) as exc:
        run.registry.set_experiment_state(run.experiment_id, "PAUSED")
        raise errors.ExperimentNotCompleted(
            f"Could not connect to the Ray cluster at {mask_text(target) or 'a new local Ray'} "
            f"({type(exc).__name__}: {mask_text(str(exc))}). Experiment {run.experiment_id} is PAUSED. Check "
            "that `ray start --head` runs there and the address (and Ray's auth token, if the "
            "cluster uses one), then `ckptstore experiment resume "
            f"{run.experiment_id} --engine ray --address HOST:PORT`."
        ) from exc


def run_on_ray(run: ExperimentRun, address: str | None) -> RunOutcome:
    """Run (or continue) ``run``'s experiment on the Ray cluster at ``address`` (``None``:
    ``RAY_ADDRESS``, else a local Ray started for this run)."""
    ray = _import_ray()
    config = run.config
    slots = check_config(config)
    started_ray = not ray.is_initialized()
    if started_ray:
        _connect(ray, run, address)
    try:
        try:
            check_reachable(run.registry_url, run.storage_config.spec, other_hosts=other_hosts(ray))
        except errors.UnreachableFromCluster:
            run.registry.set_experiment_state(run.experiment_id, "PAUSED")
            raise
        run.queue.ensure_slots()
        logger.info(
            "Experiment %d on Ray (%s): %d slot(s) per trial",
            run.experiment_id,
            address or os.environ.get("RAY_ADDRESS") or "local",
            slots,
        )
        with _DriverStop(_stop_flag_class().remote()) as stop:
            searcher = _searcher_class()(
                run.queue,
                run.final_metric,
                script=not config.entrypoint.is_trial_class,
                stopping=stop.stopping,
            )
            try:
                _tuner(run, slots, searcher, stop.flag).fit()
            finally:
                searcher.hand_back()
    finally:
        if started_ray:
            ray.shutdown()
    outcome = run.conclude(stopped=stop.stopping.is_set())
    where = f" --address {address}" if address else ""
    return dataclasses.replace(
        outcome, resume_options=f" --engine ray{where}", interrupted_by=stop.signum
    )


def _tuner(run: ExperimentRun, slots: int, searcher: Any, stop_flag: Any) -> Any:
    """The Tune run of the experiment's trials; each gets everything it needs in its
    arguments (``spec``, through the object store, so no secret lands in Tune's files)."""
    from ray import tune

    from ckptstore import defaults

    config = run.config
    cmd = trial_command(config)
    results = str(defaults.home() / "ray_results")
    spec = {
        "experiment_env": run.experiment_env(),
        "cmd": cmd,
        "cwd": str(run.model_dir),
        "slots": slots,
        "results": results,
        "stop": stop_flag,
    }
    # Tune's own SIGINT handler would end the run without pausing the trials; _DriverStop's
    # handles SIGINT and SIGTERM alike.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    # One worker of a multi-slot trial per CPU; the Tune trial that launches them takes no CPU
    # (Tune refuses an empty request, so it asks for a little memory instead).
    resources = {"CPU": 1} if slots == 1 else {"CPU": 0, "memory": LAUNCHER_MEMORY}
    trainable = tune.with_resources(tune.with_parameters(_tune_trial, spec=spec), resources)
    return tune.Tuner(
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


__all__ = ["ENGINES", "check_config", "other_hosts", "run_on_ray"]
