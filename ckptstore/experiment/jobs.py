"""Jobs: ``ckptstore job run CONFIG MODEL_DIR`` runs a non-training script (batch inference,
evaluation, export) the way an experiment runs a trial, and records it in the registry.

The config is an experiment config without the training parts (the reference's
``batch_inference.yaml``)::

    entrypoint_script: python3 batch_inference.py
    data:
        trial_id: 7
        batch_size: 64
    resources:
        slots: 2

The script runs in ``MODEL_DIR`` with ``import determined`` resolving to ckptstore, under
ckptstore's interpreter (see :mod:`ckptstore.launch.process`), with ``CKPTSTORE_JOB_ID``, the
config's ``data`` (``context.config_data``), storage and registry in its environment; no trial
is created. ``resources.slots: N > 1`` starts N workers with ``TF_CONFIG``
(:mod:`ckptstore.launch.tensorflow`); ``context.wrap_data`` shards the data and
``context.predict`` gathers the predictions back in order. The job's state (ACTIVE, then
COMPLETED, ERROR or CANCELED), exit status and output (stored every few seconds while it runs)
are in the registry: ``ckptstore job list/describe/logs``.

Storage precedence is the experiment runner's: the ``storage`` argument, the config's
``checkpoint_storage``, ``CKPTSTORE_STORAGE``, the default folder.

Example::

    outcome = run_job("batch_inference.yaml", ".", storage="s3://bucket/ckpts")
    assert outcome.state == "COMPLETED", outcome.log_tail
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core import info as trial_info
from ckptstore.experiment.common import (
    child_process_env,
    die_with_parent,
    open_registry,
    registry_url,
    run_settings,
)
from ckptstore.experiment.config import ExperimentConfig, load_config, parse_config
from ckptstore.experiment.runner import _storage_config, warn_ignored_keys
from ckptstore.launch.process import OutputTail, child_command
from ckptstore.registry.jobs import CHECKPOINTS_USED_KEY

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)

_POLL_S = 0.2
#: How often a running job's output is written to the registry (``ckptstore job logs``).
LOG_FLUSH_S = 2.0
#: Variables of a trial that must not leak into a job started from inside one.
_TRIAL_ONLY_ENV = (trial_info.TRIAL_ID_ENV, trial_info.EXPERIMENT_ID_ENV, trial_info.HPARAMS_ENV)


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its id, state, exit status and the last lines of its output."""

    job_id: int
    state: str
    exit_code: int
    log_tail: str

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    def message(self) -> str:
        lines = [f"Job {self.job_id} ended {self.state} (exit status {self.exit_code})."]
        if self.state != "CANCELED":
            lines.append("Last lines of its log:")
            lines += ["  | " + line for line in (self.log_tail or "(no output)").splitlines()]
        lines.append(f"The whole log: `ckptstore job logs {self.job_id}`.")
        return "\n".join(lines)


def _job_config(config_path: str | os.PathLike[str] | dict[str, Any]) -> ExperimentConfig:
    config = (
        parse_config(config_path) if isinstance(config_path, dict) else load_config(config_path)
    )
    if config.entrypoint.is_trial_class:
        raise errors.InvalidConfig(
            "A job runs a script: set `entrypoint_script: python3 batch_inference.py`. "
            f"Received: entrypoint {config.entrypoint.raw!r} (a TFKerasTrial class trains; use "
            "`ckptstore experiment create` for it)."
        )
    return config


def _job_env(
    job_id: int,
    config: ExperimentConfig,
    storage: StorageConfig,
    registry_url: str,
    model_dir: str,
) -> dict[str, str]:
    settings: dict[str, str | None] = dict.fromkeys(_TRIAL_ONLY_ENV)  # a job is no trial
    settings[trial_info.JOB_ID_ENV] = str(job_id)
    settings.update(
        run_settings(
            data=config.data, storage=storage, registry_url=registry_url, slots=config.slots
        )
    )
    return child_process_env(os.environ, settings, model_dir=model_dir, who="ckptstore job run")


class _Job:
    """One running job process: forwards SIGTERM/SIGINT, stores its output as it goes."""

    def __init__(
        self, registry: Registry, job_id: int, cmd: list[str], cwd: str, env: dict
    ) -> None:
        self.registry = registry
        self.job_id = job_id
        self.stopped = False
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        assert self.proc.stdout is not None
        self.output = OutputTail(self.proc.stdout, sys.stderr)

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning("Received signal %d: stopping job %d", signum, self.job_id)
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            flushed = time.monotonic()
            while self.proc.poll() is None:
                time.sleep(_POLL_S)
                if time.monotonic() - flushed > LOG_FLUSH_S:
                    self.registry.set_job_state(self.job_id, log=self.output.full())
                    flushed = time.monotonic()
            self.output.join()
            return int(self.proc.returncode)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def run_job(
    config_path: str | os.PathLike[str] | dict[str, Any],
    model_dir: str | os.PathLike[str],
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
) -> JobOutcome:
    """Run a job to its end (see the module docstring); returns its :class:`JobOutcome`.

    Raises :class:`~ckptstore.errors.InvalidConfig` (bad config, trial-class entrypoint, missing
    folder) or a storage error before anything runs.
    """
    config = _job_config(config_path)
    folder = Path(model_dir).resolve()
    if not folder.is_dir():
        raise errors.InvalidConfig(
            f"MODEL_DIR {str(folder)!r} is not a folder. Pass the folder holding the job's "
            "script, e.g. `ckptstore job run batch_inference.yaml .`."
        )
    resolved = _storage_config(storage, config)
    warn_ignored_keys(config)
    reg, owned = open_registry(registry)
    try:
        storage_url = resolved.to_env()
        job_id = reg.create_job(config.raw, str(folder), storage_url, config.description or None)
        cmd = child_command(config.entrypoint.command())
        if config.slots > 1:
            cmd = [sys.executable, "-m", "ckptstore.launch.tensorflow", "--", *cmd]
        logger.info("Job %d: running %s with %d worker(s)", job_id, cmd, config.slots)
        env = _job_env(job_id, config, resolved, registry_url(registry), str(folder))
        job = _Job(reg, job_id, cmd, str(folder), env)
        try:
            code = job.wait()
        except BaseException:
            reg.set_job_state(job_id, "ERROR", log=job.output.full())
            raise
        state = "COMPLETED" if code == 0 else ("CANCELED" if job.stopped else "ERROR")
        reg.set_job_state(job_id, state, exit_code=code, log=job.output.full())
        logger.info("Job %d ended %s (exit status %d)", job_id, state, code)
        return JobOutcome(job_id, state, code, job.output.text())
    finally:
        if owned:
            reg.close()


def describe_job(job_id: int, *, registry: Registry | str | None = None) -> dict[str, Any]:
    """A job as a JSON-able dict (without its log; see :func:`job_log`)."""
    reg, owned = open_registry(registry)
    try:
        job = reg.get_job(job_id)
        return {
            "id": job.id,
            "name": job.name,
            "state": job.state,
            "exit_code": job.exit_code,
            "model_dir": job.model_dir,
            "storage": job.storage_url,
            "data": dict(job.config.get("data") or {}),
            "checkpoints_loaded": list(job.config.get(CHECKPOINTS_USED_KEY) or []),
            "entrypoint": job.config.get("entrypoint_script", job.config.get("entrypoint")),
            "created_at": job.created_at.isoformat() if job.created_at else None,
            "ended_at": job.ended_at.isoformat() if job.ended_at else None,
        }
    finally:
        if owned:
            reg.close()


def list_jobs(*, registry: Registry | str | None = None) -> list[dict[str, Any]]:
    """Every job, as :func:`describe_job` dicts."""
    reg, owned = open_registry(registry)
    try:
        ids = [job.id for job in reg.list_jobs()]
        return [describe_job(i, registry=reg) for i in ids]
    finally:
        if owned:
            reg.close()


def job_log(job_id: int, *, registry: Registry | str | None = None) -> str:
    """The output of a job's workers as stored (updated every few seconds while it runs)."""
    reg, owned = open_registry(registry)
    try:
        return reg.get_job(job_id).log
    finally:
        if owned:
            reg.close()


__all__ = ["JobOutcome", "describe_job", "job_log", "list_jobs", "run_job"]
