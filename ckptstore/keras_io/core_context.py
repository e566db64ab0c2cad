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
from collections.abc import Iterator, Mapping
from typing import Any

from ckptstore import defaults, errors
from ckptstore.keras_io import trial_info
from ckptstore.keras_io.preempt import DEFAULT_SIGNALS, PreemptContext
from ckptstore.keras_io.train_context import TrainContext

logger = logging.getLogger(__name__)

#: Determined's GC keys, accepted in ``checkpoint_gc`` (and in a ``checkpoint_storage`` dict).
GC_KEYS = ("save_trial_latest", "save_trial_best", "save_experiment_best")
#: Extra keys ``checkpoint_gc`` may hold to say how "best" is judged.
GC_METRIC_KEYS = ("metric", "smaller_is_better")

ACTIVE, COMPLETED, ERROR, PAUSED = "ACTIVE", "COMPLETED", "ERROR", "PAUSED"


class Context:
    """What :func:`init` yields: Determined's ``core.Context``.

    Attributes:
        checkpoint: a :class:`ckptstore.checkpointing.CheckpointContext` for this trial.
        train: a :class:`~ckptstore.keras_io.train_context.TrainContext` (metrics to the registry).
        distributed: the :class:`~ckptstore.keras_io.distributed.DistributedContext`.
        preempt: a :class:`~ckptstore.keras_io.preempt.PreemptContext`.
        info: a :class:`~ckptstore.keras_io.trial_info.ClusterInfo` (``info.trial.trial_id``,
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
        checkpoint: Any,
        train: TrainContext,
        distributed: Any,
        preempt: PreemptContext,
        info: trial_info.ClusterInfo,
        registry: Any,
        owns_registry: bool = False,
        owns_distributed: bool = True,
    ) -> None:
        self.checkpoint = checkpoint
        self.train = train
        self.distributed = distributed
        self.preempt = preempt
        self.info = info
        self.registry = registry
        self._owns_registry = owns_registry
        self._owns_distributed = owns_distributed
        self._closed = False

    @property
    def storage(self) -> Any:
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

    def close(self, exc: BaseException | None = None, set_trial_state: bool = False) -> None:
        """Wait for background uploads, then release everything. Idempotent.

        Raises the first background upload failure (a
        :class:`~ckptstore.errors.BackgroundUploadError`) unless ``exc`` (the exception already
        ending the block) is given; then the failure is logged so it does not hide ``exc``.
        With ``set_trial_state``, the chief marks the trial COMPLETED, PAUSED (preempted) or ERROR.
        """
        if self._closed:
            return
        self._closed = True
        upload_error: BaseException | None = None
        try:
            self.checkpoint.wait()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            upload_error = err
            if exc is not None:
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
def resolve_storage(storage: Any) -> tuple[Any, dict[str, Any]]:
    """``(storage spec, gc keys)``: the argument, else ``CKPTSTORE_STORAGE``, else the default
    local folder. GC keys are taken out of a Determined ``checkpoint_storage`` dict."""
    if storage is None:
        storage = trial_info.storage_from_env() or defaults.default_storage_url()
    if isinstance(storage, Mapping):
        from ckptstore.storage_backends import split_storage_config

        storage_dict, gc = split_storage_config(dict(storage))
        return storage_dict, dict(gc)
    return storage, {}


def build_gc_policy(checkpoint_gc: Mapping[str, Any] | None) -> Any:
    """A GC policy from Determined's keys, or None (keep every checkpoint) for None.

    ``{}`` gives Determined's defaults (keep the latest and the best checkpoint of the trial).
    """
    if checkpoint_gc is None:
        return None
    if not isinstance(checkpoint_gc, Mapping):
        raise errors.InvalidConfig(
            "checkpoint_gc must be a dict of Determined GC keys "
            f"{list(GC_KEYS + GC_METRIC_KEYS)}. Received: {type(checkpoint_gc).__name__}."
        )
    unknown = sorted(set(checkpoint_gc) - set(GC_KEYS) - set(GC_METRIC_KEYS))
    if unknown:
        raise errors.InvalidConfig(
            f"checkpoint_gc has unknown key(s) {unknown}; use {list(GC_KEYS + GC_METRIC_KEYS)}."
        )
    for key in GC_KEYS:
        value = checkpoint_gc.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise errors.InvalidConfig(
                f"checkpoint_gc.{key} must be an integer >= 0. Received: {key}={value!r}."
            )
    from ckptstore.checkpointing.gc import GCPolicy

    return GCPolicy.from_determined(**dict(checkpoint_gc))


def _single_distributed() -> Any:
    from ckptstore.keras_io.distributed import DistributedContext

    return DistributedContext(rank=0, size=1)


def _resolve_trial(
    registry: Any,
    distributed: Any,
    trial_id: int | None,
    experiment_id: int | None,
    hparams: dict[str, Any] | None,
    reconcile: Any = None,
) -> tuple[int, dict[str, Any], str | None]:
    """On the chief: get or create the trial row, find its latest checkpoint; broadcast.
    ``reconcile(trial_id)`` (optional) repairs the trial's PENDING rows from storage first."""
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
    storage: Any = None,
    registry: Any = None,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    hparams: Mapping[str, Any] | None = None,
    distributed: Any = None,
    checkpoint_gc: Mapping[str, Any] | None = None,
    preempt_signals: bool = True,
    set_trial_state: bool = False,
    checkpoint_storage: Any = None,
    close_distributed: bool = True,
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
        set_trial_state: on exit the chief marks the trial COMPLETED (clean exit), PAUSED
            (preempted) or ERROR (exception). Off by default: the trial row keeps its state, so
            a script run several times (resume) is not marked finished by the first run.
        close_distributed: close ``distributed`` on exit (as Determined does); False keeps the
            channel open for a caller that owns it.

    On exit, waits for background uploads (a failure is raised), restores signal handlers and
    closes the distributed channel, checkpoint context and (if opened here) the registry.

    Example::

        with ckptstore.core.init(storage="/tmp/ckpts", trial_id=1) as ctx:
            print(ctx.info.latest_checkpoint)
    """
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.registry import Registry, open_registry

    if storage is not None and checkpoint_storage is not None:
        raise errors.InvalidConfig("Pass storage= or checkpoint_storage= (an alias), not both.")
    storage_spec, storage_gc = resolve_storage(
        storage if storage is not None else checkpoint_storage
    )
    gc_policy = build_gc_policy(
        checkpoint_gc if checkpoint_gc is not None else (storage_gc or None)
    )

    if trial_id is None:
        trial_id = trial_info.parse_int_env(trial_info.TRIAL_ID_ENV)
    if experiment_id is None:
        experiment_id = trial_info.parse_int_env(trial_info.EXPERIMENT_ID_ENV)
    if hparams is None:
        hparams = trial_info.parse_json_env(trial_info.HPARAMS_ENV)
    hparams = dict(hparams) if hparams is not None else None

    owns_distributed = distributed is None or close_distributed
    distributed = distributed if distributed is not None else _single_distributed()
    owns_registry = not isinstance(registry, Registry)
    reg = None
    preempt = None
    ckpt = None
    try:
        reg = open_registry(registry)
        from ckptstore.checkpointing.reconcile import reconcile_trial

        tid, trial_hparams, latest = _resolve_trial(
            reg,
            distributed,
            trial_id,
            experiment_id,
            hparams,
            reconcile=lambda t: reconcile_trial(storage_spec, reg, t),
        )
        ckpt = CheckpointContext(
            storage_spec,
            index=reg,
            trial_id=tid,
            experiment_id=experiment_id,
            distributed=distributed,
            gc_policy=gc_policy,
        )
        preempt = PreemptContext(distributed, signals=DEFAULT_SIGNALS if preempt_signals else ())
        info = trial_info.ClusterInfo(
            trial_info.TrialInfo(trial_id=tid, experiment_id=experiment_id, hparams=trial_hparams),
            storage=storage_spec if isinstance(storage_spec, (str, dict)) else None,
            registry=reg,
            latest_checkpoint=latest,
        )
        train = TrainContext(reg, tid, distributed, experiment_id=experiment_id)
        context = Context(
            checkpoint=ckpt,
            train=train,
            distributed=distributed,
            preempt=preempt,
            info=info,
            registry=reg,
            owns_registry=owns_registry,
            owns_distributed=close_distributed,
        )
    except BaseException:
        if preempt is not None:
            preempt.close()
        if ckpt is not None:
            with contextlib.suppress(Exception):
                ckpt.close()
        if owns_distributed:
            with contextlib.suppress(Exception):
                distributed.close()
        if reg is not None and owns_registry:
            with contextlib.suppress(Exception):
                reg.close()
        raise
    logger.info("%r (latest checkpoint: %s)", context, latest)
    try:
        yield context
    except BaseException as exc:
        context.close(exc=exc, set_trial_state=set_trial_state)
        raise
    context.close(set_trial_state=set_trial_state)


__all__ = ["Context", "build_gc_policy", "init", "resolve_storage"]
