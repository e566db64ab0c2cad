"""The local experiment runner: ``create``, ``resume``, ``describe`` and ``list`` experiments.

``create_experiment(config, model_dir)`` checks the config (nothing runs when it is bad),
records the experiment in the registry, then runs its trials: one after another, or up to
``searcher.max_concurrent_trials`` at once, each in its own process (a ``model_def:Class``
entrypoint runs in :mod:`ckptstore.keras_io.trial.worker`, a script entrypoint such as
``python3 train.py`` runs under ckptstore's interpreter with ``import determined`` resolving to
ckptstore, see :mod:`ckptstore.launch.process`). Every trial gets its id, hyperparameters, storage and registry
through the environment (:mod:`ckptstore.core.info`), and its checkpoints, metrics and
GC go through the registry. Trials die with the runner (Linux ``PR_SET_PDEATHSIG``), so a killed
runner leaves no orphans; ``resume_experiment(id)`` then continues every unfinished trial from
its latest checkpoint and starts the trials still missing.

Several runners, on one machine or many, can work on one search: one runs ``ckptstore
experiment create CONFIG MODEL_DIR`` (or ``create --no-run``), every other runs ``ckptstore
experiment join ID`` against the same registry (PostgreSQL across machines; the Optuna study
lives in it too) and the same checkpoint storage. Which runner runs which trial is decided by
the experiment's Optuna study (:mod:`ckptstore.experiment.optuna_queue`): runners take waiting
trials from it, Optuna's heartbeats mark them as owned, and the trial of a runner that died is
re-queued by Optuna and continued by another runner from its latest checkpoint. The last
runner to finish marks the experiment COMPLETED, or ERROR when every trial failed.
:func:`run_experiment` returns how the run ended (the state and, for each failed trial, the last
lines of its output); ``ckptstore experiment create/resume`` exit non-zero unless the
experiment COMPLETED with no trial in ERROR.

Storage precedence: the ``storage`` argument, else the config's ``checkpoint_storage``, else
``CKPTSTORE_STORAGE``, else the default local folder.

Example::

    from ckptstore.experiment import create_experiment, describe_experiment

    exp_id = create_experiment("examples/mnist_tfkeras_trial/const.yaml",
                               "examples/mnist_tfkeras_trial")
    print(describe_experiment(exp_id)["best_trial"])
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core import info as trial_info
from ckptstore.experiment.common import (
    MODEL_DIR_ENV,
    RUNNER_KEY,
    die_with_parent,
    experiment_config,
    open_registry,
    registry_url,
    run_settings,
    trial_command,
    trial_env,
)
from ckptstore.experiment.config import ExperimentConfig, load_config, parse_config
from ckptstore.experiment.metrics import searcher_metric_value
from ckptstore.experiment.optuna_queue import Claim, TrialQueue, runner_name
from ckptstore.experiment.trial_logs import TrialLogs

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)

FINISHED = ("COMPLETED", "ERROR", "CANCELED")
_POLL_S = 0.2
#: How often a runner with room looks for trials to claim or create (and a waiting one polls).
_SCAN_S = 2.0


# ---- helpers ------------------------------------------------------------------------------------
def warn_ignored_keys(config: ExperimentConfig) -> None:
    """One warning naming the config keys that only mean something on a Determined cluster
    or that Determined itself removed."""
    if config.ignored_keys:
        logger.warning(
            "Config keys that only apply on a Determined cluster (or that Determined removed) "
            "are ignored here: %s",
            ", ".join(config.ignored_keys),
        )


def _storage_config(storage: StorageSpec | None, config: ExperimentConfig) -> StorageConfig:
    """The experiment's storage (:func:`~ckptstore.storage_backends.config.resolve`: the
    argument, the config's ``checkpoint_storage``, ``CKPTSTORE_STORAGE``, the default) with the
    config's retention keys, opened once so a bad URL/dict fails before any trial starts."""
    from ckptstore.storage_backends.spec import resolve

    resolved = resolve(storage, fallback=config.checkpoint_storage, retention=config.retention)
    if resolved.instance is None:
        resolved.open().close()
    return resolved


def _check_model_dir(config: ExperimentConfig, model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise errors.InvalidConfig(
            f"MODEL_DIR {str(model_dir)!r} is not a folder. Pass the folder holding your model "
            "code, e.g. `ckptstore experiment create const.yaml .`."
        )
    if config.entrypoint.is_trial_class:
        assert config.entrypoint.module
        rel = config.entrypoint.module.replace(".", "/")
        if not ((model_dir / f"{rel}.py").exists() or (model_dir / rel / "__init__.py").exists()):
            raise errors.InvalidConfig(
                f"Invalid experiment config at `entrypoint`: module {config.entrypoint.module!r} "
                f"is not in {str(model_dir)!r} (no {rel}.py). Fix `entrypoint` or MODEL_DIR."
            )


def _final_metric(registry: Registry, trial_id: int, metric: str) -> float | None:
    rows = registry.get_metrics(trial_id, "validation")
    for row in reversed(rows):
        value = searcher_metric_value(row.metrics, metric)
        if value is not None:
            return value
    return None


@dataclasses.dataclass(frozen=True)
class TrialFailure:
    """A trial that ended in ERROR: its exit status (None if another runner ran it) and the
    last lines of its output."""

    trial_id: int
    exit_status: int | None
    log_tail: str


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How :func:`run_experiment` ended: the experiment's state and its failed trials."""

    experiment_id: int
    state: str
    failed: list[TrialFailure]
    #: Options the resume command needs to continue on the same engine (``--engine ray``).
    resume_options: str = ""
    #: The signal that stopped the run (SIGINT for Ctrl-C, SIGTERM), None when none did.
    interrupted_by: int | None = None

    @property
    def ok(self) -> bool:
        """True when the experiment COMPLETED with no trial in ERROR."""
        return self.state == "COMPLETED" and not self.failed

    def message(self) -> str:
        """What went wrong, naming each failed trial with the last lines of its log."""
        exp = self.experiment_id
        if not self.failed:
            by = ""
            if self.interrupted_by is not None:
                name = signal.Signals(self.interrupted_by).name
                by = " by Ctrl-C (SIGINT)" if name == "SIGINT" else f" by {name}"
            return (
                f"Experiment {exp} was interrupted{by} and is {self.state}; continue it with "
                f"`ckptstore experiment resume {exp}{self.resume_options}`."
            )
        lines = [f"Experiment {exp} ended {self.state} with {len(self.failed)} failed trial(s)."]
        for failure in self.failed:
            status = "" if failure.exit_status is None else f" (exit status {failure.exit_status})"
            lines.append(f"Trial {failure.trial_id} ERROR{status}. Last lines of its log:")
            lines += ["  | " + line for line in (failure.log_tail or "(no output)").splitlines()]
        lines.append(f"Fix the trial's code or config; see `ckptstore experiment describe {exp}`.")
        return "\n".join(lines)


def searcher_env(config: ExperimentConfig) -> dict[str, str]:
    """What ``core_context.searcher`` in a trial needs: the searcher's lengths and the plugin
    that asks Optuna whether to go on at a rung (see :mod:`ckptstore.core._searcher`)."""

    s = config.searcher
    length = s.search_length()
    env = {
        trial_info.SEARCHER_ENV: json.dumps(
            {
                "name": s.name,
                "metric": s.metric,
                "unit": length[0] if length else None,
                "rungs": s.rung_lengths(),
            }
        )
    }
    # (a TFKerasTrial's controller asks the pruner at its rungs itself)
    if s.name == "adaptive_asha" and not config.entrypoint.is_trial_class:
        env[trial_info.ORACLE_ENV] = "ckptstore.experiment.searcher:oracle_from_env"
    return env


# ---- the run loop -------------------------------------------------------------------------------
class ExperimentRun:
    """Runs (or continues) one experiment's trials until its queue is empty.

    Several runs (processes, machines) may work on one experiment at once: each takes
    trials from the experiment's Optuna queue (:class:`~.optuna_queue.TrialQueue`), and a runner
    with nothing left to take waits while other runners' trials run, to continue any whose
    runner dies (Optuna re-queues it after its heartbeat's grace period). The Ray engine
    places the same queue's trials on a cluster through :meth:`experiment_env`, ``queue``,
    :meth:`final_metric` and :meth:`conclude`.

    Example::

        from ckptstore.registry import Registry

        with Registry("sqlite:///reg.db") as registry:
            run = ExperimentRun(3, registry, "sqlite:///reg.db", storage=None)
            outcome = run.run()   # trials as processes here, until the queue is empty
    """

    def __init__(
        self,
        experiment_id: int,
        registry: Registry,
        registry_url: str,
        storage: StorageSpec | None,
        model_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.experiment_id = experiment_id
        self.registry = registry
        self.registry_url = registry_url
        exp = registry.get_experiment(experiment_id)
        runner = dict((exp.config or {}).get(RUNNER_KEY) or {})
        self.config = parse_config(experiment_config(registry, experiment_id))
        if model_dir is not None:
            folder = Path(model_dir).resolve()
            _check_model_dir(self.config, folder)
            self.model_dir = str(folder)
        else:
            self.model_dir = runner.get("model_dir") or os.getcwd()
        from ckptstore.storage_backends.spec import resolve

        # the argument, else the storage `create` recorded, else the config's, env, default
        self.storage_config = resolve(
            storage if storage is not None else runner.get("storage"),
            fallback=self.config.checkpoint_storage,
            retention=self.config.retention,
        )
        self.queue = TrialQueue(self.config, experiment_id, registry, registry_url)
        self.running: dict[int, tuple[subprocess.Popen, Claim]] = {}
        self.logs = TrialLogs(self.storage_config, runner_name())
        self.restarts: dict[int, int] = {}
        self.failures: dict[int, TrialFailure] = {}
        self._stop = False
        self._signal: int | None = None  # the first signal that stopped this runner
        self._next_scan = 0.0
        self._waiting_logged = False

    def final_metric(self, trial_id: int) -> float | None:
        """The trial's last value of the searcher metric (what the study is told)."""
        return _final_metric(self.registry, trial_id, self.config.searcher.metric)

    def experiment_env(self) -> dict[str, str]:
        """Everything this experiment's trial processes need, as environment keys set on top
        of the environment they start in, without the per-trial keys: the config's
        ``environment.environment_variables``, then (winning over them) the experiment id,
        model folder, data config, storage, registry, worker count and searcher settings.
        All of it is sent explicitly, never left to be inherited: the Ray engine ships it to
        each node (whose own environment may hold none of it), where
        :func:`~ckptstore.experiment.common.trial_env` adds the trial's keys."""
        return {
            **self.config.environment_variables,
            trial_info.EXPERIMENT_ID_ENV: str(self.experiment_id),
            MODEL_DIR_ENV: str(self.model_dir),
            **run_settings(
                data=self.config.data,
                storage=self.storage_config,
                registry_url=self.registry_url,
                slots=self.config.slots_per_trial,
            ),
            **searcher_env(self.config),
        }

    def _launch(self, claim: Claim) -> None:
        trial_id, hparams = claim.trial_id, claim.hparams
        optuna_id = claim.optuna_id if self.queue.searcher is not None else None
        logger.info(
            "Experiment %d: starting trial %d with %s", self.experiment_id, trial_id, hparams
        )
        self.registry.set_trial_state(trial_id, "ACTIVE")
        try:
            cmd = trial_command(self.config, launcher=True)
            proc = subprocess.Popen(
                cmd,
                cwd=self.model_dir,
                env=trial_env(os.environ, self.experiment_env(), trial_id, hparams, optuna_id),
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
                stdout=subprocess.PIPE,  # teed to our stdout and to <storage>/logs/<trial id>/
                stderr=subprocess.STDOUT,
            )
        except (OSError, ValueError) as exc:
            # The trial fails, not the runner: a runner that died here left its claim's
            # heartbeat thread running and `experiment create` never exited.
            self._fail_to_start(claim, f"{type(exc).__name__}: {exc}")
            return
        self.logs.follow(trial_id, proc)
        self.running[trial_id] = (proc, claim)

    def _fail_to_start(self, claim: Claim, why: str) -> None:
        logger.error("Trial %d could not start: %s", claim.trial_id, why)
        self.registry.set_trial_state(claim.trial_id, "ERROR")
        self.failures[claim.trial_id] = TrialFailure(claim.trial_id, None, why)
        self.queue.tell(claim, None)

    def _finish(self, claim: Claim, rc: int) -> None:
        """Record how the trial's process ended: restarted here, re-queued (this runner
        stops), or finished and told to the study."""
        trial_id = claim.trial_id
        tail = self.logs.close(trial_id)
        state = self.registry.get_trial(trial_id).state
        if rc != 0 and not self._stop:
            n = self.restarts.get(trial_id, 0)
            if n < self.config.max_restarts:
                self.restarts[trial_id] = n + 1
                logger.warning(
                    "Trial %d exited with %d; restart %d of %d",
                    trial_id,
                    rc,
                    n + 1,
                    self.config.max_restarts,
                )
                self._launch(claim)
                return
            self.registry.set_trial_state(trial_id, "ERROR")
            self.failures[trial_id] = TrialFailure(trial_id, rc, tail)
            logger.error("Trial %d failed (exit status %d)", trial_id, rc)
            self.queue.tell(claim, None)
            return
        if state == "ACTIVE" and self._stop:
            # Stopped by this runner's signal, whatever its exit status (a script without a
            # preemption check dies of Ctrl-C): paused, continued by `experiment resume`.
            state = "PAUSED"
            self.registry.set_trial_state(trial_id, state)
        elif rc == 0 and state == "ACTIVE" and not self.config.entrypoint.is_trial_class:
            state = "COMPLETED"  # a script that exits 0 unasked has finished
            self.registry.set_trial_state(trial_id, state)
        if state not in FINISHED:  # stopped by a signal: any runner continues it later
            self.queue.requeue(claim)
            logger.info(
                "Experiment %d: trial %d handed back to the queue", self.experiment_id, trial_id
            )
            return
        value = None
        if state == "COMPLETED":
            value = _final_metric(self.registry, trial_id, self.config.searcher.metric)
        self.queue.tell(claim, value)
        logger.info("Experiment %d: trial %d ended %s", self.experiment_id, trial_id, state)

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning("Received signal %d: asking trials to checkpoint and stop", signum)
        self._stop = True
        self._signal = self._signal or signum
        for proc, _ in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def _fill(self) -> None:
        """Take waiting trials from the queue while there is room (and re-queue the trials of
        runners that stopped sending heartbeats, so this runner may take them)."""
        if time.monotonic() < self._next_scan:
            return
        self._next_scan = time.monotonic() + _SCAN_S
        self.queue.reap()
        while not self._stop and len(self.running) < self.config.searcher.max_concurrent_trials:
            claim = self.queue.pop()
            if claim is None:
                return
            self._waiting_logged = False
            self._launch(claim)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        self.queue.ensure_slots()
        old_handlers = {}
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            while True:
                if not self._stop:
                    self._fill()
                if not self.running:
                    if self._stop or not self.queue.busy():
                        break
                    if not self._waiting_logged:
                        logger.info(
                            "Experiment %d: nothing left to start here; waiting while other "
                            "runners work (to continue any trial whose runner dies)",
                            self.experiment_id,
                        )
                        self._waiting_logged = True
                    time.sleep(_SCAN_S)
                    continue
                time.sleep(_POLL_S)
                for trial_id, (proc, claim) in list(self.running.items()):
                    rc = proc.poll()
                    if rc is not None:
                        del self.running[trial_id]
                        self._finish(claim, rc)
                        self._next_scan = 0.0
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            for trial_id, (proc, claim) in self.running.items():
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                self._pause_if_active(trial_id)
                self.queue.requeue(claim)
            self.logs.close_all()
        return self.conclude(self._stop)

    def _pause_if_active(self, trial_id: int) -> None:
        """A trial this runner terminated on its way out shows PAUSED, not ACTIVE (logged,
        never raised: the runner may be leaving on another error)."""
        try:
            if self.registry.get_trial(trial_id).state == "ACTIVE":
                self.registry.set_trial_state(trial_id, "PAUSED")
        except errors.CkptstoreError as exc:
            logger.warning("Could not mark trial %d PAUSED: %s", trial_id, exc)

    def conclude(self, stopped: bool) -> RunOutcome:
        """Mark the experiment COMPLETED (ERROR when every trial failed) once every trial
        finished, else PAUSED unless other runners still work on it; how the run ended."""
        cfg = self.config
        states = [t.state for t in self.registry.list_trials(self.experiment_id)]
        done = len(states) >= cfg.searcher.max_trials and all(s in FINISHED for s in states)
        if done:
            final = "ERROR" if all(s == "ERROR" for s in states) else "COMPLETED"
            self.registry.set_experiment_state(self.experiment_id, final)
            logger.info("Experiment %d ended %s", self.experiment_id, final)
        elif self.queue.busy() and not stopped:
            logger.info("Experiment %d: this runner stops; other runners go on", self.experiment_id)
        else:
            self.registry.set_experiment_state(self.experiment_id, "PAUSED")
            logger.info("Experiment %d paused", self.experiment_id)
        return self._outcome()

    def _outcome(self) -> RunOutcome:
        trials = self.registry.list_trials(self.experiment_id)
        # a trial that failed before this run (or on another runner) shows its stored log
        failed = [
            self.failures.get(t.id) or TrialFailure(t.id, None, self.logs.stored_tail(t.id))
            for t in trials
            if t.state == "ERROR"
        ]
        self.logs.close_all()  # the storage stored_tail may have opened
        state = self.registry.get_experiment(self.experiment_id).state
        return RunOutcome(self.experiment_id, state, failed, interrupted_by=self._signal)


def _check_engine(engine: str) -> None:
    if engine not in ("local", "ray"):
        raise errors.InvalidConfig(f"engine must be 'local' or 'ray'. Received: engine={engine!r}")


def _start(run: ExperimentRun, engine: str, address: str | None) -> RunOutcome:
    """Run the experiment on the chosen engine (the local runner by default)."""
    if engine == "ray":
        from ckptstore.experiment.ray_engine import run_on_ray

        return run_on_ray(run, address)
    return run.run()


# ---- public API -----------------------------------------------------------------------------------
def create_experiment(
    config_path: str | os.PathLike[str] | dict[str, Any],
    model_dir: str | os.PathLike[str],
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    run: bool = True,
    engine: str = "local",
    address: str | None = None,
) -> int:
    """Check a config, record the experiment, run its trials; returns the experiment id.

    Args:
        config_path: a YAML config file (or the config as a dict).
        model_dir: the folder with the entrypoint's code (``model_def.py``, ``train.py``).
        storage: checkpoint storage URL/dict; default: the config's ``checkpoint_storage``,
            then ``CKPTSTORE_STORAGE``, then the default local folder.
        registry: a ``Registry`` or URL; default ``CKPTSTORE_REGISTRY`` or the SQLite default.
        run: False only records the experiment (run it with :func:`resume_experiment`).
        engine: ``"local"`` (trials as processes here) or ``"ray"`` (trials as Ray Tune trials
            on the cluster at ``address``; see :mod:`ckptstore.experiment.ray_engine`).
        address: the Ray cluster (``host:port``); default ``RAY_ADDRESS`` or a local Ray.

    Raises :class:`~ckptstore.errors.InvalidConfig` (bad config, missing entrypoint) or a storage
    error before any trial starts.

    Example::

        exp_id = create_experiment("const.yaml", ".", storage="s3://bucket/ckpts")
    """
    _check_engine(engine)
    config = (
        parse_config(config_path) if isinstance(config_path, dict) else load_config(config_path)
    )
    folder = Path(model_dir).resolve()
    _check_model_dir(config, folder)
    if engine == "ray":
        from ckptstore.experiment.ray_engine import check_config

        check_config(config)
    resolved = _storage_config(storage, config)
    warn_ignored_keys(config)
    reg, owned = open_registry(registry)
    try:
        stored = dict(config.raw)
        stored[RUNNER_KEY] = {
            "model_dir": str(folder),
            # a URL is kept for `resume`/`join`; a dict (maybe with secrets) comes from the config
            "storage": resolved.url if resolved.block is None else None,
        }
        exp_id = reg.create_experiment(
            config.description or None, config=stored, description=config.description or None
        )
        logger.info(
            "Created experiment %d (other machines sharing this registry and storage can join "
            "the search with `ckptstore experiment join %d`)",
            exp_id,
            exp_id,
        )
        if run:
            run_ = ExperimentRun(
                exp_id, reg, registry_url(registry), storage if storage is not None else None
            )
            _start(run_, engine, address)
        return exp_id
    finally:
        if owned:
            reg.close()


def resume_experiment(
    experiment_id: int,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    engine: str = "local",
    address: str | None = None,
) -> int:
    """Continue an experiment, or join it from another machine: every unfinished trial from
    its latest checkpoint, then the trials the searcher still wants. Returns the experiment id.

    Several runners may work on one experiment at once: run this (``ckptstore experiment
    resume ID``) on every machine that shares the registry (PostgreSQL; a SQLite file works for
    several runners on one machine) and the checkpoint storage. Runners take trials from the
    experiment's Optuna queue (:mod:`ckptstore.experiment.optuna_queue`), so no trial runs twice
    and exactly ``max_trials`` are created. A runner with nothing left to take waits while other
    runners' trials run and continues those of a runner that dies, once Optuna sees its
    heartbeat stale (``CKPTSTORE_HEARTBEAT_GRACE``, default 30 s; also after a kill on this
    machine, since a heartbeat does not say where its runner ran).

    Args:
        experiment_id: the experiment to run.
        storage: checkpoint storage; default: the one recorded at ``create``.
        registry: a ``Registry`` or URL; default ``CKPTSTORE_REGISTRY`` or the SQLite default.
        model_dir: the folder with the entrypoint's code on this machine; default: the folder
            given at ``create``.
        engine: as for :func:`create_experiment` (a driver lost mid-run: resume with
            ``engine="ray"`` continues its trials once their heartbeat is stale).
        address: as for :func:`create_experiment`.

    Example::

        resume_experiment(3)
    """
    run_experiment(
        experiment_id,
        storage=storage,
        registry=registry,
        model_dir=model_dir,
        engine=engine,
        address=address,
    )
    return experiment_id


def run_experiment(
    experiment_id: int,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    engine: str = "local",
    address: str | None = None,
) -> RunOutcome:
    """:func:`resume_experiment`, returning how the run ended: the experiment's state and each
    failed trial with the last lines of its output (what ``ckptstore experiment create`` prints
    before exiting non-zero).

    Example::

        outcome = run_experiment(3)
        if not outcome.ok:
            print(outcome.message())
    """
    reg, owned = open_registry(registry)
    try:
        reg.get_experiment(experiment_id)  # ExperimentNotFound early
        _check_engine(engine)
        run = ExperimentRun(experiment_id, reg, registry_url(registry), storage, model_dir)
        reg.set_experiment_state(experiment_id, "ACTIVE")
        return _start(run, engine, address)
    finally:
        if owned:
            reg.close()


__all__ = [
    "ExperimentRun",
    "RunOutcome",
    "TrialFailure",
    "create_experiment",
    "resume_experiment",
    "run_experiment",
]
