"""An experiment's trial queue, kept by Optuna: who runs which trial, heartbeats, and re-queueing
the trial of a runner that died. ckptstore schedules nothing itself.

Every experiment (``single`` too) has an Optuna study in an ``RDBStorage`` next to the registry
(:func:`~ckptstore.experiment.searcher.optuna_storage_url`: the registry's PostgreSQL database,
or a SQLite file beside the registry's). The study is the queue:

- the first runner enqueues ``max_trials`` WAITING Optuna trials, one per *slot*, under the
  registry's experiment lock (:meth:`Registry.run_exclusive`), so racing runners enqueue them
  once;
- a runner takes a WAITING trial with Optuna's own atomic WAITING -> RUNNING step
  (``set_trial_state_values``), a trial handed back or retried before any slot not started
  yet, and Optuna's heartbeat thread records a heartbeat for it every
  ``heartbeat_interval`` seconds while the trial's process runs;
- every runner calls :func:`optuna.storages.fail_stale_trials` while it works or waits: a
  trial whose heartbeat is older than ``grace_period`` (its runner was killed, its machine
  lost) is failed, and :class:`optuna.storages.RetryHeartbeatStaleTrialCallback` enqueues a
  copy (same params, same user attributes, :meth:`retried_trial_number` = the slot's first
  Optuna trial) that any runner then takes;
- a slot's registry trial is found by the slot number (:meth:`Registry.ensure_slot_trial`) or
  the Optuna trial's ``ckptstore_trial_id`` attribute, so a retried slot continues the *same*
  registry trial (same ``continue_id``) from its latest committed checkpoint.

Settings (environment, whole seconds): ``CKPTSTORE_HEARTBEAT_INTERVAL`` (default 10) and
``CKPTSTORE_HEARTBEAT_GRACE`` (default 30): a dead runner's trial is re-queued at most about
``grace + the other runners' scan period (2 s)`` after its last heartbeat. A trial is re-queued
this way at most ``max(max_restarts, 5)`` times (a lost runner is a lost machine more often than
a bad trial, and ckptstore's ``max_restarts`` defaults to 0; Determined's default was 5); after
that its registry trial is marked ERROR.

Example::

    queue = TrialQueue(config, experiment_id, registry, registry_url)
    queue.ensure_slots()
    claim = queue.pop()            # None when nothing is waiting
    ...                            # run claim.trial_id with claim.hparams
    queue.tell(claim, 0.93)        # or queue.requeue(claim) to hand it back
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import warnings
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.experiment.config import ExperimentConfig
from ckptstore.experiment.searcher import (
    TRIAL_ATTR,
    Searcher,
    open_optuna_storage,
    resolve_study_name,
)

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from ckptstore.registry import Registry

logger = logging.getLogger(__name__)

HEARTBEAT_ENV = "CKPTSTORE_HEARTBEAT_INTERVAL"
GRACE_ENV = "CKPTSTORE_HEARTBEAT_GRACE"
DEFAULT_HEARTBEAT_S = 10
DEFAULT_GRACE_S = 30
#: Study user attribute set once the slots are enqueued (its value: how many).
SLOTS_ATTR = "ckptstore_slots"
#: Optuna trial user attribute: the runner (``host:pid``) that took the trial last.
RUNNER_ATTR = "ckptstore_runner"
FINISHED = ("COMPLETED", "ERROR", "CANCELED")
#: Fewest times a trial whose runner died is re-queued (see the module docstring).
MIN_REQUEUES = 5


def _seconds_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise errors.InvalidConfig(
            f"{name} must be a positive whole number of seconds (Optuna's heartbeat settings "
            f"are integers), e.g. {default}. Received: {raw!r}"
        )
    return value


def heartbeat_settings() -> tuple[int, int]:
    """``(heartbeat_interval, grace_period)`` in seconds, from the environment."""
    interval = _seconds_from_env(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)
    grace = _seconds_from_env(GRACE_ENV, max(DEFAULT_GRACE_S, 3 * interval))
    if grace <= interval:
        raise errors.InvalidConfig(
            f"{GRACE_ENV} must be longer than {HEARTBEAT_ENV}, or every trial looks dead "
            f"between two heartbeats. Received: interval={interval}, grace={grace}"
        )
    return interval, grace


def runner_name() -> str:
    """How a runner shows in ``describe``: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Requeue:
    """Optuna's :class:`RetryHeartbeatStaleTrialCallback`, plus a log line, and the registry trial
    marked ERROR once the retries are used up (else it would stay ACTIVE forever)."""

    def __init__(self, registry: Registry, max_retry: int | None, *, handed_back: bool = False):
        import optuna

        self.registry = registry
        self.max_retry = max_retry
        #: the trial's own runner gave it back (it stops): said so, not "no heartbeat"
        self.handed_back = handed_back
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=max_retry, inherit_intermediate_values=True
            )

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial_id = trial.user_attrs.get(TRIAL_ATTR)
        retries = len(trial.system_attrs.get("retry_history", [])) + 1
        if self.max_retry is not None and retries > self.max_retry:
            logger.error(
                "Trial %s lost its runner (no heartbeat from %s) %d times; not retrying it",
                trial_id,
                trial.user_attrs.get(RUNNER_ATTR),
                retries,
            )
            if trial_id is not None:
                self.registry.set_trial_state(int(trial_id), "ERROR")
            return
        logger.warning(
            "Trial %s handed back by its runner %s (it stops): re-queued for any runner"
            if self.handed_back
            else "Trial %s lost its runner (no heartbeat from %s): re-queued for any runner",
            trial_id,
            trial.user_attrs.get(RUNNER_ATTR),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._retry(study, trial)


def queue_storage(registry_url: str, registry: Registry, max_retry: int | None) -> Any:
    """The experiment's Optuna ``RDBStorage`` with heartbeats and re-queueing on."""

    interval, grace = heartbeat_settings()
    return open_optuna_storage(
        registry_url,
        heartbeat_interval=interval,
        grace_period=grace,
        heartbeat_stale_trial_callback=_Requeue(registry, max_retry),
    )


@dataclasses.dataclass
class Claim:
    """A trial this runner took from the queue; its heartbeat runs until :meth:`TrialQueue.tell`
    or :meth:`TrialQueue.requeue`."""

    trial_id: int
    hparams: dict[str, Any]
    optuna_id: int
    number: int
    slot: int
    retried: bool
    heartbeat: Any = dataclasses.field(repr=False)


class TrialQueue:
    """The trial queue of one experiment (see the module docstring).

    Args:
        config: the experiment config (searcher, ``max_trials``, ``max_restarts``).
        experiment_id: the registry experiment.
        registry: the open registry.
        registry_url: the registry's URL with password (names the Optuna storage).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        experiment_id: int,
        registry: Registry,
        registry_url: str,
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.config = config
        self.experiment_id = experiment_id
        self.registry = registry
        requeues = max(config.max_restarts, MIN_REQUEUES)
        self.storage = queue_storage(registry_url, registry, requeues)
        name = resolve_study_name(registry, experiment_id, self.storage)
        self.searcher: Searcher | None = None
        if config.searcher.name != "single":
            self.searcher = Searcher(
                config, experiment_id, registry_url, storage=self.storage, study=name
            )
            self.study = self.searcher.study
        else:
            self.study = optuna.create_study(
                storage=self.storage,
                study_name=name,
                direction="minimize" if config.searcher.smaller_is_better else "maximize",
                load_if_exists=True,
            )

    # ---- filling the queue ------------------------------------------------------------------
    def ensure_slots(self) -> None:
        """Enqueue the experiment's slots once (the first runner does, under the registry's
        experiment lock); a no-op afterwards."""
        if self.study.user_attrs.get(SLOTS_ATTR) is None:
            self.registry.run_exclusive(
                self.experiment_id, self._fill_slots, what="enqueue the search's trials"
            )

    def _fill_slots(self) -> None:
        import optuna

        if self.study.user_attrs.get(SLOTS_ATTR) is not None:
            return  # another runner did it while this one waited for the lock
        state = optuna.trial.TrialState
        # Trials an older ckptstore (registry leases) created: unfinished ones go back in the
        # queue linked to their registry trial; their Optuna trials never had heartbeats.
        existing = self.registry.list_trials(self.experiment_id)
        old = {}
        for t in self.study.get_trials(deepcopy=False):
            if TRIAL_ATTR in t.user_attrs:
                old[int(t.user_attrs[TRIAL_ATTR])] = t
        for trial in existing:
            if trial.state in FINISHED:
                continue
            before = old.get(trial.id)
            if before is not None and before.state == state.RUNNING:
                self.storage.set_trial_state_values(before._trial_id, state=state.FAIL)
            self.study.add_trial(
                optuna.trial.create_trial(
                    state=state.WAITING,
                    params=before.params if before is not None else None,
                    distributions=before.distributions if before is not None else None,
                    user_attrs={TRIAL_ATTR: trial.id},
                )
            )
        for _ in range(max(0, self.config.searcher.max_trials - len(existing))):
            self.study.add_trial(optuna.trial.create_trial(state=state.WAITING))
        self.study.set_user_attr(SLOTS_ATTR, self.config.searcher.max_trials)

    def reap(self) -> None:
        """Fail trials whose runner stopped sending heartbeats; Optuna re-queues them."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    # ---- taking and finishing trials --------------------------------------------------------
    def pop(self) -> Claim | None:
        """Take a waiting trial (a slot, or a retry of a dead runner's trial), or None."""
        import optuna
        from optuna.storages._heartbeat import get_heartbeat_thread

        state = optuna.trial.TrialState
        waiting = self.study.get_trials(deepcopy=False, states=(state.WAITING,))
        # A trial handed back or retried (linked to its registry trial) before any slot not
        # started yet: as Determined continues a paused experiment's trials before its searcher
        # starts new ones. adaptive_asha then judges trials at a rung in the order they started
        # (the next slot taken first met the rung alone, was promoted, and both ran on).
        waiting.sort(key=lambda t: (TRIAL_ATTR not in t.user_attrs, t.number))
        for frozen in waiting:
            optuna_id = frozen._trial_id
            # A heartbeat before taking it: a runner that dies right after the take leaves a
            # trial Optuna sees as stale (it skips RUNNING trials that never had a heartbeat).
            self.storage.record_heartbeat(optuna_id)
            try:
                if not self.storage.set_trial_state_values(optuna_id, state=state.RUNNING):
                    continue  # another runner took it first
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            # Optuna's own heartbeat thread (what Study.optimize runs around each trial).
            heartbeat = get_heartbeat_thread(optuna_id, self.storage)
            heartbeat.start()
            try:
                return self._claim(frozen, heartbeat)
            except BaseException:
                heartbeat.join()  # the trial goes stale and is re-queued
                raise
        return None

    def _claim(self, frozen: optuna.trial.FrozenTrial, heartbeat: Any) -> Claim:
        import optuna

        origin = frozen.system_attrs.get("failed_trial")  # retried_trial_number()
        slot = int(origin) if origin is not None else frozen.number
        linked = frozen.user_attrs.get(TRIAL_ATTR)
        optuna_id = frozen._trial_id
        if linked is not None:
            trial_id = int(linked)
        else:
            trial = optuna.trial.Trial(self.study, optuna_id)

            def propose() -> dict[str, Any]:
                if self.searcher is None:
                    return self.config.constant_hparams()
                return self.searcher.suggest(trial)

            trial_id = self.registry.ensure_slot_trial(self.experiment_id, slot, propose)
            self.storage.set_trial_user_attr(optuna_id, TRIAL_ATTR, trial_id)
        self.storage.set_trial_user_attr(optuna_id, RUNNER_ATTR, runner_name())
        hparams = dict(self.registry.get_trial(trial_id).hparams)
        if origin is not None:
            logger.info("Trial %d: retrying it here (Optuna trial %d)", trial_id, frozen.number)
        return Claim(
            trial_id=trial_id,
            hparams=hparams,
            optuna_id=optuna_id,
            number=frozen.number,
            slot=slot,
            retried=origin is not None,
            heartbeat=heartbeat,
        )

    def tell(self, claim: Claim, value: float | None) -> None:
        """Finish the claim's Optuna trial with the final searcher metric (failed when None or
        not finite; left alone when the trial already finished, e.g. pruned by its worker)."""
        import optuna

        try:
            if not self.storage.get_trial(claim.optuna_id).state.is_finished():
                if value is None or not math.isfinite(value):
                    self.study.tell(claim.number, state=optuna.trial.TrialState.FAIL)
                else:
                    self.study.tell(claim.number, value)
        finally:
            claim.heartbeat.join()

    def requeue(self, claim: Claim) -> None:
        """Hand an unfinished trial back (this runner stops): failed, then re-queued at once
        by Optuna's retry callback, so any runner continues it from its checkpoint."""
        import optuna

        try:
            self.storage.set_trial_state_values(claim.optuna_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            claim.heartbeat.join()
            return  # another runner judged it stale and re-queued it already
        claim.heartbeat.join()
        requeue = _Requeue(self.registry, None, handed_back=True)
        requeue(self.study, self.storage.get_trial(claim.optuna_id))

    def busy(self) -> bool:
        """True while any trial of the search waits or runs (on any runner)."""
        import optuna

        state = optuna.trial.TrialState
        return bool(self.study.get_trials(deepcopy=False, states=(state.WAITING, state.RUNNING)))


def runners(
    registry_url: str, experiment_id: int, registry: Registry | None = None
) -> dict[int, tuple[str | None, bool]]:
    """``{registry trial id: (runner host:pid, running now)}`` from the experiment's study (the
    latest Optuna trial of each registry trial); empty when the experiment or its study does
    not exist. ``registry``: the registry at ``registry_url`` when it is open already."""
    import optuna

    from ckptstore.registry import Registry

    storage = open_optuna_storage(registry_url)
    owned = registry is None
    reg = Registry(registry_url) if registry is None else registry
    try:
        try:
            name = resolve_study_name(reg, experiment_id, storage)
        except errors.ExperimentNotFound:
            return {}
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return {}
        out: dict[int, tuple[str | None, bool]] = {}
        for t in study.get_trials(deepcopy=False):  # by number: later retries win
            if TRIAL_ATTR in t.user_attrs:
                running = t.state == optuna.trial.TrialState.RUNNING
                out[int(t.user_attrs[TRIAL_ATTR])] = (t.user_attrs.get(RUNNER_ATTR), running)
        return out
    finally:
        # Callers poll this (describe, tests): an engine left to the garbage collector keeps
        # its pooled connection open, and PostgreSQL's connection slots run out.
        storage.engine.dispose()
        if owned:
            reg.close()


__all__ = [
    "GRACE_ENV",
    "HEARTBEAT_ENV",
    "Claim",
    "TrialQueue",
    "heartbeat_settings",
    "queue_storage",
    "runners",
]
