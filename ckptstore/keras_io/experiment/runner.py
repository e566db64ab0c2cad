"""The local experiment runner: ``create``, ``resume``, ``describe`` and ``list`` experiments.

``create_experiment(config, model_dir)`` checks the config (nothing runs when it is bad),
records the experiment in the registry, then runs its trials: one after another, or up to
``searcher.max_concurrent_trials`` at once, each in its own process (a ``model_def:Class``
entrypoint runs in :mod:`ckptstore.keras_io.experiment.worker`, a script entrypoint such as
``python3 train.py`` runs as is). Every trial gets its id, hyperparameters, storage and registry
through the environment (:mod:`ckptstore.keras_io.trial_info`), and its checkpoints, metrics and
GC go through the registry. Trials die with the runner (Linux ``PR_SET_PDEATHSIG``), so a killed
runner leaves no orphans; ``resume_experiment(id)`` then continues every unfinished trial from
its latest checkpoint and starts the trials still missing.

Several runners, on one machine or many, can work on one search: one runs ``ckptstore
experiment create CONFIG MODEL_DIR`` (or ``create --no-run``), every other runs ``ckptstore
experiment resume ID`` against the same registry (PostgreSQL across machines; the Optuna study
lives in it too) and the same checkpoint storage. A runner claims each trial in the registry
before starting it and renews the lease while the trial runs
(:mod:`ckptstore.keras_io.experiment.leasing`), so no trial runs twice; new trials are created
and claimed in one transaction, so together they create exactly ``max_trials``. The last
runner to finish marks the experiment COMPLETED.

Storage precedence: the ``storage`` argument, else the config's ``checkpoint_storage``, else
``CKPTSTORE_STORAGE``, else the default local folder.

Example::

    from ckptstore.keras_io.experiment import create_experiment, describe_experiment

    exp_id = create_experiment("examples/mnist_tfkeras_trial/const.yaml",
                               "examples/mnist_tfkeras_trial")
    print(describe_experiment(exp_id)["best_trial"])
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptstore import defaults, errors
from ckptstore.keras_io import trial_info
from ckptstore.keras_io.experiment.common import (
    MODEL_DIR_ENV,
    OPTUNA_TRIAL_ENV,
    RUNNER_KEY,
    experiment_config,
)
from ckptstore.keras_io.experiment.config import ExperimentConfig, load_config, parse_config
from ckptstore.keras_io.experiment.leasing import (
    LeaseKeeper,
    lease_seconds_from_env,
    owner_is_dead_here,
    runner_identity,
)
from ckptstore.keras_io.experiment.metrics import searcher_metric_value

logger = logging.getLogger(__name__)

FINISHED = ("COMPLETED", "ERROR", "CANCELED")
_POLL_S = 0.2
#: How often a runner with room looks for trials to claim or create (and a waiting one polls).
_SCAN_S = 2.0


# ---- helpers ------------------------------------------------------------------------------------
def _registry_url(registry: Any) -> str:
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


def _open_registry(registry: Any) -> tuple[Any, bool]:
    from ckptstore.registry import Registry

    if isinstance(registry, Registry):
        return registry, False
    return Registry(_registry_url(registry)), True


def _storage_spec(storage: Any, config: ExperimentConfig) -> str | dict[str, Any]:
    if storage is not None:
        spec = storage
    elif config.checkpoint_storage is not None:
        spec = config.checkpoint_storage
    else:
        spec = trial_info.storage_from_env() or defaults.default_storage_url()
    if not isinstance(spec, (str, dict)):
        url = getattr(spec, "url", None)
        if not isinstance(url, str):
            raise errors.InvalidConfig(
                f"storage must be a URL or a checkpoint_storage dict. Received: {type(spec).__name__}."
            )
        spec = url
    return spec


def _check_storage(spec: str | dict[str, Any]) -> None:
    """Open the storage once so a bad URL/dict fails before any trial starts."""
    from ckptstore.storage_backends import open_storage, split_storage_config

    if isinstance(spec, dict):
        spec, _ = split_storage_config(dict(spec))
    open_storage(spec).close()


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


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _final_metric(registry: Any, trial_id: int, metric: str) -> float | None:
    rows = registry.get_metrics(trial_id, "validation")
    for row in reversed(rows):
        value = searcher_metric_value(row.metrics, metric)
        if value is not None:
            return value
    return None


def _best_metric(registry: Any, trial_id: int, metric: str, smaller: bool) -> float | None:
    values = []
    for row in registry.get_metrics(trial_id, "validation"):
        value = searcher_metric_value(row.metrics, metric)
        if value is not None and math.isfinite(value):
            values.append(value)
    if not values:
        return None
    return min(values) if smaller else max(values)


# ---- the run loop -------------------------------------------------------------------------------
class _Run:
    """Runs (or continues) one experiment's trials until the searcher has no more.

    Several ``_Run`` s (processes, machines) may work on one experiment at once: each trial is
    leased in the registry by the runner that runs it (:mod:`.leasing`), new trials are created
    and claimed in one transaction that keeps ``max_trials``, and a runner with nothing left to
    start waits while other live runners still hold unfinished trials, to take them over if
    those runners die.
    """

    def __init__(
        self,
        experiment_id: int,
        registry: Any,
        registry_url: str,
        storage: Any,
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
        if storage is not None:
            self.storage = _storage_spec(storage, self.config)
        elif runner.get("storage") is not None:
            self.storage = runner["storage"]
        else:
            self.storage = _storage_spec(None, self.config)
        self.searcher = None
        if self.config.searcher.name != "single":
            from ckptstore.keras_io.experiment.searcher import Searcher

            self.searcher = Searcher(self.config, experiment_id, registry_url)
        self.leases = LeaseKeeper(registry, runner_identity(), lease_seconds_from_env())
        self.running: dict[int, tuple[subprocess.Popen, int | None]] = {}
        self.restarts: dict[int, int] = {}
        self._stop = False
        self._full = False  # the experiment has max_trials trials: create no more
        self._next_scan = 0.0
        self._others: list[int] = []  # unfinished trials live runners elsewhere hold
        self._waiting_logged = False

    def _env(self, trial_id: int, hparams: dict[str, Any], optuna_id: int | None) -> dict[str, str]:
        env = dict(os.environ)
        env[trial_info.TRIAL_ID_ENV] = str(trial_id)
        env[trial_info.EXPERIMENT_ID_ENV] = str(self.experiment_id)
        env[trial_info.HPARAMS_ENV] = json.dumps(hparams)
        env[trial_info.DATA_CONFIG_ENV] = json.dumps(self.config.data)
        env[trial_info.STORAGE_ENV] = (
            self.storage if isinstance(self.storage, str) else json.dumps(self.storage)
        )
        env[trial_info.REGISTRY_ENV] = self.registry_url
        env[MODEL_DIR_ENV] = str(self.model_dir)
        if optuna_id is not None:
            env[OPTUNA_TRIAL_ENV] = str(optuna_id)
        else:
            env.pop(OPTUNA_TRIAL_ENV, None)
        pythonpath = [str(self.model_dir)] + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
        ]
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        return env

    def _launch(self, trial_id: int, hparams: dict[str, Any], optuna_id: int | None) -> None:
        if self.config.entrypoint.is_trial_class:
            cmd = [sys.executable, "-m", "ckptstore.keras_io.experiment.worker"]
        else:
            cmd = self.config.entrypoint.command()
        logger.info(
            "Experiment %d: starting trial %d with %s", self.experiment_id, trial_id, hparams
        )
        self.registry.set_trial_state(trial_id, "ACTIVE")
        proc = subprocess.Popen(
            cmd,
            cwd=self.model_dir,
            env=self._env(trial_id, hparams, optuna_id),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.running[trial_id] = (proc, optuna_id)

    def _finish(self, trial_id: int, rc: int, optuna_id: int | None) -> None:
        try:
            if not self._settle(trial_id, rc, optuna_id):
                return  # restarted: the lease stays with this runner
        except BaseException:
            self.leases.release(trial_id)
            raise
        self.leases.release(trial_id)

    def _settle(self, trial_id: int, rc: int, optuna_id: int | None) -> bool:
        """Record how the trial's process ended; False if it was restarted."""
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
                self._launch(trial_id, self.registry.get_trial(trial_id).hparams, optuna_id)
                return False
            self.registry.set_trial_state(trial_id, "ERROR")
            logger.error("Trial %d failed (exit status %d)", trial_id, rc)
            if self.searcher is not None and optuna_id is not None:
                self.searcher.tell(optuna_id, None)
            return True
        if rc == 0 and state == "ACTIVE" and not self.config.entrypoint.is_trial_class:
            self.registry.set_trial_state(trial_id, "COMPLETED")
            state = "COMPLETED"
        if state == "COMPLETED" and self.searcher is not None and optuna_id is not None:
            value = _final_metric(self.registry, trial_id, self.config.searcher.metric)
            self.searcher.tell(optuna_id, value)
        logger.info("Experiment %d: trial %d ended %s", self.experiment_id, trial_id, state)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning("Received signal %d: asking trials to checkpoint and stop", signum)
        self._stop = True
        for proc, _ in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    # ---- finding work -----------------------------------------------------------------------
    def _claim_unfinished(self) -> tuple[int, dict[str, Any], int | None] | None:
        """Claim an unfinished trial nobody works on (never started here, left by a killed
        runner, or paused); also notes which unfinished trials live runners elsewhere hold."""
        trials = self.registry.list_trials(self.experiment_id)
        self._full = self._full or len(trials) >= self.config.searcher.max_trials
        leases = {
            lease.trial_id: lease for lease in self.registry.list_trial_leases(self.experiment_id)
        }
        others = []
        for t in trials:
            if t.state in FINISHED or t.id in self.running:
                continue
            lease = leases.get(t.id)
            replace = None
            if lease is not None and lease.held and lease.owner != self.leases.owner:
                if not owner_is_dead_here(lease.owner):
                    others.append(t.id)
                    continue
                replace = lease.owner
            if not self.registry.claim_trial(
                t.id, self.leases.owner, self.leases.lease_seconds, replace_owner=replace
            ):
                others.append(t.id)  # another runner was quicker, or it just finished
                continue
            self.leases.add(t.id)
            if replace is not None:
                logger.info("Trial %d: its runner %s is gone; taking it over", t.id, replace)
            trial = self.registry.get_trial(t.id)
            optuna_id = None
            if self.searcher is not None:
                optuna_id = self.searcher.optuna_ids().get(t.id)
                if optuna_id is None:
                    optuna_id = self.searcher.adopt(t.id)
            return t.id, dict(trial.hparams), optuna_id
        self._others = others
        return None

    def _create(self) -> tuple[int, dict[str, Any], int | None] | None:
        """Create and claim a new trial, unless the experiment has max_trials already. The
        searcher is asked while the registry holds the experiment locked, so runners racing
        here ask in the order their trials are created, and never for a trial not created."""
        cfg = self.config
        if self._full:
            return None
        asked: list[tuple[dict[str, Any], int | None]] = []

        def propose() -> dict[str, Any]:
            if self.searcher is None:
                asked.append((cfg.constant_hparams(), None))
            else:
                asked.append(self.searcher.ask())
            return asked[-1][0]

        try:
            trial_id = self.registry.create_claimed_trial(
                self.experiment_id,
                hparams=propose,
                max_trials=cfg.searcher.max_trials,
                owner=self.leases.owner,
                lease_seconds=self.leases.lease_seconds,
            )
        except BaseException:
            self._abandon(asked)
            raise
        if trial_id is None:
            self._full = True
            self._abandon(asked)
            return None
        self._abandon(asked[:-1])  # asked again when the transaction was retried
        self.leases.add(trial_id)
        hparams, optuna_id = asked[-1]
        if self.searcher is not None and optuna_id is not None:
            self.searcher.link(optuna_id, trial_id)
        return trial_id, hparams, optuna_id

    def _abandon(self, asked: list[tuple[dict[str, Any], int | None]]) -> None:
        for _, optuna_id in asked:
            if self.searcher is not None and optuna_id is not None:
                self.searcher.tell(optuna_id, None)

    def _fill(self) -> None:
        """Start trials while there is room: unfinished ones first, then new ones."""
        if time.monotonic() < self._next_scan:
            return
        while not self._stop and len(self.running) < self.config.searcher.max_concurrent_trials:
            work = self._claim_unfinished() or self._create()
            if work is None:
                self._next_scan = time.monotonic() + _SCAN_S
                return
            self._waiting_logged = False
            self._launch(*work)

    def _drop_lost(self) -> None:
        for trial_id in self.leases.lost():
            entry = self.running.pop(trial_id, None)
            if entry is not None and entry[0].poll() is None:
                entry[0].kill()  # another runner has the trial now: no more writes from here
                entry[0].wait()
            self.leases.release(trial_id)  # forgets it; the registry row is the new owner's

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.config
        if self.searcher is not None:
            self.searcher.fail_unlinked()
        old_handlers = {}
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        self.leases.start()
        try:
            while True:
                self._drop_lost()
                if not self._stop:
                    self._fill()
                if not self.running:
                    if self._stop or not self._others:
                        break
                    if not self._waiting_logged:
                        logger.info(
                            "Experiment %d: nothing left to start here; waiting while other "
                            "runners work on trials %s (to take over any they leave)",
                            self.experiment_id,
                            self._others,
                        )
                        self._waiting_logged = True
                    time.sleep(_SCAN_S)
                    continue
                time.sleep(_POLL_S)
                for trial_id, (proc, optuna_id) in list(self.running.items()):
                    rc = proc.poll()
                    if rc is not None:
                        del self.running[trial_id]
                        self._finish(trial_id, rc, optuna_id)
                        self._next_scan = 0.0
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            for proc, _ in self.running.values():
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
            self.leases.stop()
        states = [t.state for t in self.registry.list_trials(self.experiment_id)]
        done = len(states) >= cfg.searcher.max_trials and all(s in FINISHED for s in states)
        if done:
            self.registry.set_experiment_state(self.experiment_id, "COMPLETED")
            logger.info("Experiment %d completed", self.experiment_id)
        elif self._others_working():
            logger.info("Experiment %d: this runner stops; other runners go on", self.experiment_id)
        else:
            self.registry.set_experiment_state(self.experiment_id, "PAUSED")
            logger.info("Experiment %d paused", self.experiment_id)

    def _others_working(self) -> bool:
        unfinished = {
            t.id for t in self.registry.list_trials(self.experiment_id) if t.state not in FINISHED
        }
        return any(
            lease.held and lease.trial_id in unfinished and not owner_is_dead_here(lease.owner)
            for lease in self.registry.list_trial_leases(self.experiment_id)
        )


# ---- public API -----------------------------------------------------------------------------------
def create_experiment(
    config_path: str | os.PathLike[str] | dict[str, Any],
    model_dir: str | os.PathLike[str],
    *,
    storage: Any = None,
    registry: Any = None,
    run: bool = True,
) -> int:
    """Check a config, record the experiment, run its trials; returns the experiment id.

    Args:
        config_path: a YAML config file (or the config as a dict).
        model_dir: the folder with the entrypoint's code (``model_def.py``, ``train.py``).
        storage: checkpoint storage URL/dict; default: the config's ``checkpoint_storage``,
            then ``CKPTSTORE_STORAGE``, then the default local folder.
        registry: a ``Registry`` or URL; default ``CKPTSTORE_REGISTRY`` or the SQLite default.
        run: False only records the experiment (run it with :func:`resume_experiment`).

    Raises :class:`~ckptstore.errors.InvalidConfig` (bad config, missing entrypoint) or a storage
    error before any trial starts.

    Example::

        exp_id = create_experiment("const.yaml", ".", storage="s3://bucket/ckpts")
    """
    config = (
        parse_config(config_path) if isinstance(config_path, dict) else load_config(config_path)
    )
    folder = Path(model_dir).resolve()
    _check_model_dir(config, folder)
    spec = _storage_spec(storage, config)
    _check_storage(spec)
    for key in config.ignored_keys:
        logger.info("Config key `%s` applies to a Determined cluster; ignored here", key)
    reg, owned = _open_registry(registry)
    try:
        stored = dict(config.raw)
        stored[RUNNER_KEY] = {
            "model_dir": str(folder),
            "storage": spec if isinstance(spec, str) else None,
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
            _Run(
                exp_id, reg, _registry_url(registry), storage if storage is not None else None
            ).run()
        return exp_id
    finally:
        if owned:
            reg.close()


def resume_experiment(
    experiment_id: int,
    *,
    storage: Any = None,
    registry: Any = None,
    model_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Continue an experiment, or join it from another machine: every unfinished trial from
    its latest checkpoint, then the trials the searcher still wants. Returns the experiment id.

    Several runners may work on one experiment at once: run this (``ckptstore experiment
    resume ID``) on every machine that shares the registry (PostgreSQL; a SQLite file works for
    several runners on one machine) and the checkpoint storage. Each trial is leased in the
    registry by the runner that runs it, so no trial runs twice and no more than
    ``max_trials`` are created. A runner with nothing left to start waits while other live
    runners hold unfinished trials and takes over those of a runner that dies (after its lease
    expires, ``CKPTSTORE_TRIAL_LEASE_SECONDS``, default 60 s; at once on the same host).

    Args:
        experiment_id: the experiment to run.
        storage: checkpoint storage; default: the one recorded at ``create``.
        registry: a ``Registry`` or URL; default ``CKPTSTORE_REGISTRY`` or the SQLite default.
        model_dir: the folder with the entrypoint's code on this machine; default: the folder
            given at ``create``.

    Example::

        resume_experiment(3)
    """
    reg, owned = _open_registry(registry)
    try:
        reg.get_experiment(experiment_id)  # ExperimentNotFound early
        run = _Run(experiment_id, reg, _registry_url(registry), storage, model_dir)
        reg.set_experiment_state(experiment_id, "ACTIVE")
        run.run()
        return experiment_id
    finally:
        if owned:
            reg.close()


def describe_experiment(experiment_id: int, *, registry: Any = None) -> dict[str, Any]:
    """The experiment's trials (state, hparams, batches, best metric, checkpoints, the runner
    that runs or ran each) and its best trial, metric and checkpoint by ``searcher.metric``, as
    a JSON-able dict.

    Example::

        info = describe_experiment(3)
        info["best_trial"], info["best_metric"], info["best_checkpoint"]
    """
    reg, owned = _open_registry(registry)
    try:
        exp = reg.get_experiment(experiment_id)
        config = parse_config(experiment_config(reg, experiment_id))
        metric, smaller = config.searcher.metric, config.searcher.smaller_is_better
        trials = []
        leases = {lease.trial_id: lease for lease in reg.list_trial_leases(experiment_id)}
        for t in reg.list_trials(experiment_id):
            lease = leases.get(t.id)
            latest = reg.latest_checkpoint(t.id)
            best_ckpt = reg.best_checkpoint(trial_id=t.id, metric=metric, smaller_is_better=smaller)
            trials.append(
                {
                    "id": t.id,
                    "state": t.state,
                    "hparams": t.hparams,
                    "batches_trained": latest.steps_completed if latest else 0,
                    "best_metric": _best_metric(reg, t.id, metric, smaller),
                    "latest_checkpoint": latest.uuid if latest else None,
                    "best_checkpoint": best_ckpt.uuid if best_ckpt else None,
                    # the runner (host:pid:start:token) running it now or that ran it last
                    "runner": lease.owner if lease else None,
                    "runner_active": bool(lease and lease.held),
                }
            )
        scored = [t for t in trials if t["best_metric"] is not None]
        best = None
        if scored:
            best = (min if smaller else max)(scored, key=lambda t: t["best_metric"])
        best_ckpt = reg.best_checkpoint(
            experiment_id=experiment_id, metric=metric, smaller_is_better=smaller
        )
        return {
            "id": exp.id,
            "description": exp.description or "",
            "state": exp.state,
            "searcher": config.searcher.name,
            "metric": metric,
            "smaller_is_better": smaller,
            "max_trials": config.searcher.max_trials,
            "trials": trials,
            "best_trial": best["id"] if best else None,
            "best_metric": best["best_metric"] if best else None,
            "best_checkpoint": best_ckpt.uuid if best_ckpt else None,
        }
    finally:
        if owned:
            reg.close()


def list_experiments(*, registry: Any = None) -> list[dict[str, Any]]:
    """Every experiment: id, description, state, searcher and trial count.

    Example::

        for exp in list_experiments():
            print(exp["id"], exp["state"])
    """
    reg, owned = _open_registry(registry)
    try:
        out = []
        for exp in reg.list_experiments():
            cfg = dict(exp.config or {})
            out.append(
                {
                    "id": exp.id,
                    "description": exp.description or "",
                    "state": exp.state,
                    "searcher": (cfg.get("searcher") or {}).get("name"),
                    "trials": len(reg.list_trials(exp.id)),
                    "created_at": exp.created_at.isoformat() if exp.created_at else None,
                }
            )
        return out
    finally:
        if owned:
            reg.close()


__all__ = ["create_experiment", "describe_experiment", "list_experiments", "resume_experiment"]
