"""``ckptstore.core.init()``: the core context a training script talks to (Determined's Core API).

Example::

    import ckptstore as det

    with det.core.init(storage="s3://bucket/ckpts", trial_id=1) as core_context:
        with core_context.checkpoint.store_path({"steps_completed": 10}) as (path, uuid):
            save_model(path)
        core_context.train.report_validation_metrics(10, {"val_loss": 0.3})
        if core_context.preempt.should_preempt():
            ...
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core import _info as trial_info
from ckptstore.core._heartbeat import Heartbeat
from ckptstore.core._modes import PreemptMode, TensorboardMode
from ckptstore.core._preempt import DEFAULT_SIGNALS, PreemptContext
from ckptstore.core._searcher import SearcherContext
from ckptstore.core._train import TrainContext
from ckptstore.storage_backends.spec import StorageConfig, resolve

if TYPE_CHECKING:
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing.retention import GCPolicy
    from ckptstore.core._distributed import DistributedContext
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage

logger = logging.getLogger(__name__)

ACTIVE, COMPLETED, ERROR, PAUSED = "ACTIVE", "COMPLETED", "ERROR", "PAUSED"


class ProfilerContext:
    """Determined's ``core_context.profiler`` in local mode: ``on()`` and ``off()`` do nothing
    (the profiler reported to the master's web UI)."""

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        logger.debug("core_context.profiler.on() ignored: there is no master to report to")

    def off(self) -> None:
        """Nothing to stop."""


class ExperimentalCoreContext:
    """``core_context.experimental``: Determined recorded which checkpoints and model versions a
    task (e.g. batch inference) used. Here "used" means "keep it": the checkpoint is protected
    from checkpoint GC while the context is open (a registry pin), and the use is logged.

    Example::

        version = client.get_model("mnist").get_version()
        core_context.experimental.report_task_using_model_version(version)
    """

    def __init__(self, checkpoint: CheckpointContext) -> None:
        self._checkpoint = checkpoint

    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        """``checkpoint``: an SDK ``Checkpoint`` (or anything with ``uuid``), or a UUID."""
        uuid = checkpoint if isinstance(checkpoint, str) else getattr(checkpoint, "uuid", None)
        if not isinstance(uuid, str):
            raise errors.InvalidConfig(
                "report_task_using_checkpoint needs a client.Checkpoint or a checkpoint UUID. "
                f"Received: {checkpoint!r}."
            )
        self._checkpoint.protect(uuid)
        logger.info("This task uses checkpoint %s (kept from GC while it runs)", uuid)

    def report_task_using_model_version(self, model_version: Any) -> None:
        """``model_version``: an SDK ``ModelVersion``; its checkpoint is reported as used."""
        checkpoint = getattr(model_version, "checkpoint", None)
        if checkpoint is None:
            raise errors.InvalidConfig(
                "report_task_using_model_version needs a client.ModelVersion. "
                f"Received: {model_version!r}."
            )
        self.report_task_using_checkpoint(checkpoint)


class Context:
    """What :func:`init` yields: Determined's ``core.Context``.

    Attributes:
        checkpoint: a :class:`ckptstore.checkpointing.CheckpointContext` for this trial.
        train: a :class:`~ckptstore.core._train.TrainContext` (metrics to the registry).
        distributed: the :class:`~ckptstore.core._distributed.DistributedContext`.
        preempt: a :class:`~ckptstore.core._preempt.PreemptContext`.
        searcher: a :class:`~ckptstore.core._searcher.SearcherContext` (``operations()``).
        info: a :class:`~ckptstore.core._info.ClusterInfo` (``info.trial.trial_id``,
            ``info.trial.hparams``, ``info.latest_checkpoint``, ``info.task_type == "TRIAL"``).
        registry: the :class:`ckptstore.registry.Registry` in use.
        storage: the :class:`ckptstore.storage_backends.base.Storage` checkpoints go to.

    Example::

        with ckptstore.core.init(trial_id=7) as ctx:
            print(ctx.info.trial.trial_id, ctx.info.latest_checkpoint)
    """

    def __init__(
        self,
        *,
        checkpoint: CheckpointContext,
        train: TrainContext,
        distributed: DistributedContext,
        preempt: PreemptContext,
        info: trial_info.ClusterInfo,
        registry: Registry,
        owns_registry: bool = False,
        owns_distributed: bool = True,
        set_trial_state: bool = False,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.train = train
        self.distributed = distributed
        self.preempt = preempt
        # One operation of length 1 unless init() finds an experiment's searcher.
        self.searcher = SearcherContext(distributed, [1])
        self.info = info
        self.registry = registry
        self._owns_registry = owns_registry
        self._owns_distributed = owns_distributed
        self._set_trial_state = set_trial_state
        self._heartbeat = heartbeat
        self._closed = False

    @property
    def storage(self) -> Storage:
        """The checkpoint storage (a ``Storage``)."""
        return self.checkpoint.storage

    @property
    def trial_id(self) -> int:
        """This trial's id."""
        return self.info.trial.trial_id

    @property
    def hparams(self) -> dict[str, Any]:
        """This trial's hyperparameters."""
        return self.info.trial.hparams

    def start(self) -> Context:
        """Determined starts its background threads here; :func:`init` already did. Returns
        the context."""
        return self

    def alert(
        self,
        title: str | None = None,
        description: str | None = None,
        level: str | None = "info",
    ) -> None:
        """Determined sent an alert to the master's webhooks; here it is logged at ``level``
        (Determined's ``"debug"``, ``"info"``, ``"warn"``, ``"error"``)."""
        levels = {
            "debug": logging.DEBUG,
            "info": logging.INFO,
            "warn": logging.WARNING,
            "error": logging.ERROR,
            None: logging.INFO,
        }
        if level not in levels:
            raise errors.InvalidConfig(
                f"level must be 'debug', 'info', 'warn' or 'error'. Received: level={level!r}."
            )
        logger.log(
            levels[level],
            "Alert from trial %s: %s %s",
            self.trial_id,
            title or "",
            description or "",
        )

    @property
    def experimental(self) -> ExperimentalCoreContext:
        """Determined's ``core_context.experimental`` (see :class:`ExperimentalCoreContext`)."""
        return ExperimentalCoreContext(self.checkpoint)

    @property
    def profiler(self) -> ProfilerContext:
        """Determined's system profiler needs the master; here (as in Determined's local mode)
        its ``on()``/``off()`` do nothing."""
        return ProfilerContext()

    def close(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: Any = None,
        *,
        exc: BaseException | None = None,
        set_trial_state: bool | None = None,
    ) -> None:
        """Wait for background uploads, then release everything. Idempotent.

        Takes Determined's ``(exc_type, exc_val, exc_tb)``; ``exc`` is the same as ``exc_val``.

        Raises the first background failure (a training-metrics write's error, see
        :class:`~ckptstore.core.TrainContext`, else a checkpoint upload's
        :class:`~ckptstore.errors.BackgroundUploadError`) unless ``exc`` (the exception already
        ending the block) is given; then the failure is logged so it does not hide ``exc``.
        With ``set_trial_state`` (default: what :func:`init` decided), the chief marks the trial
        COMPLETED, PAUSED (preempted) or ERROR.
        """
        exc = exc if exc is not None else exc_val
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = None  # sys.exit(0) inside the block is a clean end, not a failure
        if set_trial_state is None:
            set_trial_state = self._set_trial_state
        if self._closed:
            return
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.close()
        upload_error: BaseException | None = None
        try:  # the queued training metrics first: they were reported before what follows
            self.train.close()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            upload_error = err
            if exc is not None:
                logger.error("A background metrics write or TensorBoard upload failed: %s", err)
        try:
            self.checkpoint.wait()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            if upload_error is None:
                upload_error = err
            if exc is not None or upload_error is not err:
                logger.error("A background checkpoint upload failed: %s", err)
        try:
            if set_trial_state and self.distributed.rank == 0:
                if exc is not None or upload_error is not None:
                    state = ERROR
                elif self.preempt.acknowledged:
                    state = PAUSED
                else:
                    state = COMPLETED
                self.registry.set_trial_state(self.trial_id, state)
        finally:
            self.preempt.close()
            with contextlib.suppress(Exception):
                self.checkpoint.close()
            if self._owns_distributed:
                with contextlib.suppress(Exception):
                    self.distributed.close()
            if self._owns_registry:
                with contextlib.suppress(Exception):
                    self.registry.close()
        if upload_error is not None and exc is None:
            raise upload_error

    def __repr__(self) -> str:
        return (
            f"Context(trial_id={self.trial_id}, rank={self.distributed.rank}/"
            f"{self.distributed.size}, storage={getattr(self.storage, 'url', None)!r})"
        )


# ---- building blocks -----------------------------------------------------------------------------
def build_gc_policy(checkpoint_gc: Mapping[str, Any] | None) -> GCPolicy | None:
    """A GC policy from Determined's keys, or None (keep every checkpoint) for None.

    ``{}`` gives Determined's defaults (keep the latest and the best checkpoint of the trial).
    """
    if checkpoint_gc is None:
        return None
    from ckptstore.checkpointing.retention import GCPolicy, check_gc_keys

    return GCPolicy.from_determined(**check_gc_keys(checkpoint_gc, "checkpoint_gc"))


def _single_distributed() -> DistributedContext:
    from ckptstore.core._distributed import DistributedContext

    return DistributedContext(rank=0, size=1)


def _resolve_trial(
    registry: Registry,
    distributed: DistributedContext,
    trial_id: int | None,
    experiment_id: int | None,
    hparams: dict[str, Any] | None,
    reconcile: Any = None,
    storage: Storage | None = None,
) -> tuple[int, dict[str, Any], str | None]:
    """On the chief: get or create the trial row, find its latest checkpoint; broadcast.
    ``reconcile(trial_id)`` (optional) repairs the trial's PENDING rows from storage first.
    With ``storage``, a checkpoint whose manifest is gone is skipped (the newest that exists
    is taken, with a warning)."""
    payload: dict[str, Any] | None = None
    if distributed.rank == 0:
        if trial_id is None:
            trial_id = registry.create_trial(experiment_id=experiment_id, hparams=hparams or {})
            logger.info("Created trial %d in %r", trial_id, registry)
            row_hparams = hparams or {}
        else:
            row = registry.ensure_trial(trial_id, experiment_id=experiment_id, hparams=hparams)
            row_hparams = dict(getattr(row, "hparams", None) or {})
            if reconcile is not None:
                try:  # a run killed after its commit left a row PENDING: storage is the truth
                    reconcile(trial_id)
                except Exception as exc:  # noqa: BLE001 - never stop a run from starting
                    logger.warning("Reconciling trial %d's checkpoints failed: %s", trial_id, exc)
        latest = registry.latest_checkpoint(trial_id)
        if latest is not None and storage is not None:
            from ckptstore.checkpointing.reconcile import newest_in_storage
            from ckptstore.checkpointing.scan import sort_records

            found = newest_in_storage(
                storage,
                reversed(sort_records(registry.checkpoint_records(trial_id=trial_id))),
                trial_id=trial_id,
            )
            latest = found
        payload = {
            "trial_id": int(trial_id),
            "hparams": hparams if hparams is not None else row_hparams,
            "latest": latest.uuid if latest is not None else None,
        }
    if distributed.size > 1:
        payload = distributed.broadcast(payload)
    assert payload is not None
    return payload["trial_id"], dict(payload["hparams"] or {}), payload["latest"]


@contextlib.contextmanager
def init(
    *,
    storage: str | Mapping[str, Any] | Storage | None = None,
    registry: Registry | str | None = None,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    hparams: Mapping[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    checkpoint_gc: Mapping[str, Any] | None = None,
    preempt_signals: bool = True,
    set_trial_state: bool | None = None,
    checkpoint_storage: str | Mapping[str, Any] | Storage | None = None,
    close_distributed: bool = True,
    preempt_mode: PreemptMode | str = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode | str = TensorboardMode.AUTO,
    checkpoint_dedup: bool | None = None,
    signing_key: str | os.PathLike[str] | None = None,
    verify_key: str | os.PathLike[str] | None = None,
) -> Iterator[Context]:
    """Open the core context of a trial; a context manager yielding :class:`Context`.

    Args:
        storage: where checkpoints go: a URL (``s3://b/p``, ``/mnt/x``, ...), a Determined
            ``checkpoint_storage`` dict, or a ``Storage``. Default: ``CKPTSTORE_STORAGE``, else
            ``~/.local/share/ckptstore/checkpoints``. ``checkpoint_storage`` is an alias.
        registry: a ``Registry`` or URL. Default: ``CKPTSTORE_REGISTRY``, else a SQLite file.
        trial_id: the trial; default ``CKPTSTORE_TRIAL_ID``; with neither, the chief creates a
            new trial in the registry (its id is logged and in ``context.info.trial.trial_id``).
        experiment_id: default ``CKPTSTORE_EXPERIMENT_ID``.
        hparams: default ``CKPTSTORE_HPARAMS`` (JSON), else the trial row's hyperparameters.
        distributed: a ``DistributedContext`` (e.g. from ``DistributedContext.from_tf_config()``);
            default: a single worker. Closed on exit.
        checkpoint_gc: Determined GC keys (``save_trial_latest``, ``save_trial_best``,
            ``save_experiment_best``, plus ``metric``/``smaller_is_better``); ``{}`` means
            Determined's defaults. Default: the GC keys of a ``checkpoint_storage`` dict, and when
            there are none, no GC (every checkpoint is kept).
        preempt_signals: install SIGTERM/SIGINT handlers for ``context.preempt`` (main thread
            only; the old handlers are restored on exit).
        set_trial_state: the chief marks the trial ACTIVE on entry (a resume) and on exit
            COMPLETED (clean exit), PAUSED (preempted) or ERROR (exception). Default (None):
            on, unless the process was started by ``ckptstore experiment`` (local or Ray),
            whose runner records how its trials end (``CKPTSTORE_TRIAL_STATE_BY`` is set), so
            the state is written by one owner. A script run again to resume goes from PAUSED
            back to ACTIVE. False leaves the state alone. Either way the chief records a
            heartbeat every 30 s while the context is open, so a trial whose process died
            without saying so shows as LOST (``Trial.status``).
        close_distributed: close ``distributed`` on exit (as Determined does); False keeps the
            channel open for a caller that owns it.
        preempt_mode: a :class:`~ckptstore.core.PreemptMode` (Determined's argument).
        tensorboard_mode: a :class:`~ckptstore.core.TensorboardMode`: with ``AUTO`` (default)
            files written to ``train.get_tensorboard_path()`` are uploaded after each metrics
            report; with ``MANUAL`` only by ``train.upload_tensorboard_files()``.
        checkpoint_dedup: store checkpoints as content-addressed chunks cut at tensor
            boundaries (``CheckpointContext(dedup=True)``, format 2): a fine-tuning checkpoint
            uploads about the bytes of the tensors that changed. None (default): the
            ``dedup`` key of a ``checkpoint_storage`` dict, else on, on every storage (local
            paths and ``shared_fs`` included; a SavedModel stays whole in the folder there).
            False turns it off; see docs/concepts/dedup-gc.md.
        signing_key: a PEM file with an EC private key: every checkpoint is signed at commit,
            on the upload thread, in OpenSSF ``model-signing``'s format (``model.sig``; see
            :mod:`ckptstore.checkpointing.signing`). Default: ``CKPTSTORE_SIGNING_KEY``.
        verify_key: a PEM file with the trusted EC public key: restoring an unsigned or
            altered checkpoint is refused. Default: ``CKPTSTORE_VERIFY_KEY``.

    On exit, waits for background uploads (a failure is raised), restores signal handlers and
    closes the distributed channel, checkpoint context and (if opened here) the registry.

    Example::

        with ckptstore.core.init(storage="/tmp/ckpts", trial_id=1) as ctx:
            print(ctx.info.latest_checkpoint)
    """
    if storage is not None and checkpoint_storage is not None:
        raise errors.InvalidConfig("Pass storage= or checkpoint_storage= (an alias), not both.")
    storage_config = resolve(storage if storage is not None else checkpoint_storage)
    dedup = checkpoint_dedup if checkpoint_dedup is not None else storage_config.dedup
    if checkpoint_gc is None:
        from ckptstore.checkpointing.retention import run_retention

        checkpoint_gc = run_retention(storage_config.retention, trial_class=False)
    gc_policy = build_gc_policy(checkpoint_gc)
    if trial_id is None:
        trial_id = trial_info.parse_int_env(trial_info.TRIAL_ID_ENV)
    if experiment_id is None:
        experiment_id = trial_info.parse_int_env(trial_info.EXPERIMENT_ID_ENV)
    if hparams is None:
        hparams = trial_info.parse_json_env(trial_info.HPARAMS_ENV)
    if set_trial_state is None:
        set_trial_state = not os.environ.get(trial_info.TRIAL_STATE_BY_ENV)
    opened = _Opened(
        storage_config,
        registry,
        distributed if distributed is not None else _single_distributed(),
        owns_distributed=distributed is None or close_distributed,
    )
    try:
        context = _open_context(
            opened,
            trial_id,
            experiment_id,
            dict(hparams) if hparams is not None else None,
            gc_policy=gc_policy,
            dedup=dedup,
            keys={"signing_key": signing_key, "verify_key": verify_key},
            preempt_signals=preempt_signals,
            preempt_mode=preempt_mode,
            tensorboard_mode=tensorboard_mode,
            close_distributed=close_distributed,
            set_trial_state=set_trial_state,
        )
    except BaseException:
        opened.close()
        raise
    logger.info("%r (latest checkpoint: %s)", context, context.info.latest_checkpoint)
    try:
        yield context
    except BaseException as exc:
        context.close(exc=exc)
        raise
    context.close()


class _Opened:
    """What :func:`init` opens, in order, so a failure before the context exists closes each
    of them (the context closes them afterwards)."""

    def __init__(
        self,
        storage: StorageConfig,
        registry: Registry | str | None,
        distributed: DistributedContext,
        *,
        owns_distributed: bool,
    ) -> None:
        from ckptstore.registry import Registry

        self.storage = storage
        self.registry_arg = registry
        self.owns_registry = not isinstance(registry, Registry)
        self.distributed = distributed
        self.owns_distributed = owns_distributed
        # One owner opens the URL: this Storage is handed to reconcile and to the checkpoint
        # context (which closes it when it is closed), instead of each opening its own.
        self.owns_store = storage.instance is None
        self.store = storage.open()
        self.reg: Registry | None = None
        self.ckpt: CheckpointContext | None = None
        self.preempt: PreemptContext | None = None
        self.heartbeat: Heartbeat | None = None

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.close()
        if self.preempt is not None:
            self.preempt.close()
        closers = [self.ckpt.close if self.ckpt is not None else None]
        if self.ckpt is None and self.owns_store:
            closers.append(self.store.close)
        if self.owns_distributed:
            closers.append(self.distributed.close)
        if self.reg is not None and self.owns_registry:
            closers.append(self.reg.close)
        for close in closers:
            if close is not None:
                with contextlib.suppress(Exception):
                    close()


#: A prefix nothing is stored under: listing it asks the storage about its bucket only.
_REACH_PROBE = ".ckptstore-reachable/"


def check_reachable(store: Storage) -> None:
    """Ask the storage for one short listing before the trial starts, so a missing bucket or
    rejected credentials raise their typed StorageError here, not after a whole epoch at the
    first commit (and leave no PENDING row behind)."""
    store.list(_REACH_PROBE)


def _open_context(
    opened: _Opened,
    trial_id: int | None,
    experiment_id: int | None,
    hparams: dict[str, Any] | None,
    *,
    gc_policy: GCPolicy | None,
    dedup: bool | None,
    keys: Mapping[str, str | os.PathLike[str] | None],
    preempt_signals: bool,
    preempt_mode: PreemptMode | str,
    tensorboard_mode: TensorboardMode | str,
    close_distributed: bool,
    set_trial_state: bool,
) -> Context:
    """The body of :func:`init`: the trial row, checkpoint, preempt, train and searcher
    contexts over what ``opened`` holds (each kept in ``opened`` as soon as it exists)."""
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing.reconcile import reconcile_trial
    from ckptstore.registry import open_registry

    store, distributed = opened.store, opened.distributed
    if distributed.rank == 0:
        check_reachable(store)
    reg = opened.reg = open_registry(opened.registry_arg)
    tid, trial_hparams, latest = _resolve_trial(
        reg,
        distributed,
        trial_id,
        experiment_id,
        hparams,
        reconcile=lambda t: reconcile_trial(store, reg, t),
        storage=store,
    )
    if distributed.rank == 0:
        if set_trial_state:  # a run that resumes a PAUSED or ERROR trial makes it live again
            reg.set_trial_state(tid, ACTIVE)
        opened.heartbeat = Heartbeat(reg, tid)
    ckpt = opened.ckpt = CheckpointContext(
        store,
        owns_storage=opened.owns_store,
        index=reg,
        trial_id=tid,
        experiment_id=experiment_id,
        distributed=distributed,
        gc_policy=gc_policy,
        dedup=dedup,
        **keys,
    )
    ckpt.resumed_from = latest
    stopper = opened.preempt = PreemptContext(
        distributed,
        signals=DEFAULT_SIGNALS if preempt_signals else (),
        preempt_mode=preempt_mode,
    )
    given = opened.storage
    info = trial_info.ClusterInfo(
        trial_info.TrialInfo(trial_id=tid, experiment_id=experiment_id, hparams=trial_hparams),
        storage=None if given.instance is not None else dict(given.block or {}) or given.url,
        registry=reg,
        latest_checkpoint=latest,
    )
    train = TrainContext(
        reg,
        tid,
        distributed,
        experiment_id=experiment_id,
        storage=store,
        tensorboard_mode=tensorboard_mode,
    )
    context = Context(
        checkpoint=ckpt,
        train=train,
        distributed=distributed,
        preempt=stopper,
        info=info,
        registry=reg,
        owns_registry=opened.owns_registry,
        owns_distributed=close_distributed,
        set_trial_state=set_trial_state,
        heartbeat=opened.heartbeat,
    )
    searcher = context.searcher = SearcherContext.from_env(distributed, train, tid)
    if searcher.judges_validations:
        train.add_validation_hook(lambda s, m: searcher.on_validation(s, m, stopper))
    return context


__all__ = ["Context", "build_gc_policy", "init"]
