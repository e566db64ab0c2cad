"""Metrics reporting for a trial (Determined's ``core_context.train``).

Only the chief writes to the registry; calls on other workers are accepted and ignored, as in
Determined. Metric values may be Python numbers, NumPy scalars/arrays or TensorFlow tensors;
they are converted to plain JSON (non-finite floats become ``None``, since PostgreSQL's JSON
rejects NaN) without importing TensorFlow.

Training metrics are written to the registry in the background, in the order reported (see
:class:`TrainContext`): a Keras epoch end does not wait for the database. Everything else
(validation and other groups, checkpoints, reads) comes after them, as if written at the call.

Example::

    with ckptstore.core.init() as core_context:
        core_context.train.report_training_metrics(100, {"loss": 0.31})
        core_context.train.report_validation_metrics(100, {"val_loss": 0.35})
"""

from __future__ import annotations

import enum
import json
import logging
import pathlib
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.metrics import metric_value, rank_by_metric
from ckptstore.core._modes import TensorboardMode, check_mode
from ckptstore.core._ordered_writes import OrderedWrites
from ckptstore.core._tensorboard import TensorboardSync
from ckptstore.defaults import TRIAL_METADATA_PREFIX
from ckptstore.jsonsafe import to_json
from ckptstore.validators import int_at_least

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage

logger = logging.getLogger(__name__)

TRAINING = "training"
VALIDATION = "validation"


class EarlyExitReason(enum.Enum):
    """Why a trial stopped early (Determined's ``core.EarlyExitReason``)."""

    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON by the one JSON policy (:mod:`ckptstore.jsonsafe`): tensors and
    NumPy values become Python numbers/lists, non-finite floats ``None``."""
    return to_json(value, what="metrics")


class TrainContext:
    """Reports a trial's training and validation metrics to the registry.

    Args:
        registry: a :class:`ckptstore.registry.Registry` (or None: metrics are only logged).
        trial_id: the trial the metrics belong to.
        distributed: the trial's distributed context; only rank 0 writes.
        experiment_id: the trial's experiment, for :meth:`get_experiment_best_validation`.

    Training metrics (:meth:`report_training_metrics`, or :meth:`report_metrics` with group
    ``"training"``) are checked and converted at the call, then written to the registry by one
    background thread in the order reported, so the call does not wait for the database. The
    registry's contents and order are as if each was written at its call: the other reports
    wait for the queued writes first, and every call on the same ``Registry`` object (a
    checkpoint's registration, ``get_metrics``, the trial's final state, ``close``) waits for
    them too. A write that fails (the database is unreachable, the trial was deleted) raises
    its error (the same type, e.g. :class:`~ckptstore.errors.RegistryError` or
    :class:`~ckptstore.errors.TrialNotFound`) from the next call of this context (that call
    records nothing), or from :meth:`close` (``core.init``'s exit); the writes queued behind
    it are dropped, so the registry holds the reports up to the failure. :meth:`wait` waits
    for the writes and raises a failure at once.

    With ``tensorboard_mode=AUTO`` each report also uploads the new files of
    :meth:`get_tensorboard_path`, on a second background thread (in order, one upload waiting
    at most: it takes whatever is new when it runs); :meth:`close` uploads the files written
    since the last report. A failed upload raises
    :class:`~ckptstore.errors.StorageError`, naming the fix, once, from the next call of this
    context or from :meth:`close`; the next report uploads what was missed.

    Example::

        train = TrainContext(registry, trial_id=3, distributed=None)
        train.report_validation_metrics(200, {"val_accuracy": 0.93})
    """

    def __init__(
        self,
        registry: Registry,
        trial_id: int,
        distributed: Any = None,
        *,
        experiment_id: int | None = None,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        storage: Storage | None = None,
        tensorboard_mode: TensorboardMode | str = TensorboardMode.AUTO,
    ) -> None:
        self._registry = registry
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self._distributed = distributed
        self.searcher_metric = searcher_metric
        self.smaller_is_better = smaller_is_better
        self._storage = storage
        self.tensorboard_mode = check_mode(TensorboardMode, tensorboard_mode, "tensorboard_mode")
        self._tb_sync: TensorboardSync | None = None
        #: The last status given to :meth:`set_status` (Determined shows it in its web UI).
        self.status: str | None = None
        #: The reason given to :meth:`report_early_exit`, if any.
        self.early_exit: EarlyExitReason | None = None
        self._validation_hooks: list[Callable[[int, Mapping[str, Any]], None]] = []
        self._writes = OrderedWrites(f"ckptstore-metrics-{trial_id}")
        #: AUTO TensorBoard uploads: their own ordered thread (registry calls do not wait for
        #: them), failures raised like a failed metrics write; see :meth:`_upload_tensorboard`.
        self._tb_writes = OrderedWrites(f"ckptstore-tensorboard-{trial_id}")
        self._tb_queued = False
        self._tb_lock = threading.Lock()
        self._remove_barrier = (
            registry.add_barrier(self._writes.wait) if registry is not None else None
        )

    def add_validation_hook(self, hook: Callable[[int, Mapping[str, Any]], None]) -> None:
        """Call ``hook(steps_completed, metrics)`` after each validation report on the chief
        (``core_context.searcher`` judges ASHA rungs this way)."""
        self._validation_hooks.append(hook)

    @property
    def _is_chief(self) -> bool:
        return self._distributed is None or getattr(self._distributed, "rank", 0) == 0

    def wait(self) -> None:
        """Wait until every reported metric is written to the registry and every AUTO
        TensorBoard upload is done; raise the error of a background write or upload that failed
        (see the class docstring)."""
        self._writes.wait()
        self._tb_writes.wait()
        self._raise_failed_write()

    def close(self) -> None:
        """:meth:`wait`, then (``tensorboard_mode=AUTO``) upload the TensorBoard files written
        since the last report, then stop ordering the registry's calls behind this context
        (called by ``core.init``'s exit). Idempotent."""
        try:
            self._writes.close()
            if self.tensorboard_mode is TensorboardMode.AUTO and self._tb_sync is not None:
                self._upload_tensorboard(final=True)
            self._tb_writes.close()
            self._raise_failed_write()
        finally:
            if self._remove_barrier is not None:
                self._remove_barrier()
                self._remove_barrier = None

    def _raise_failed_write(self) -> None:
        failure = self._writes.take_failure()
        if failure is not None:
            if hasattr(failure, "add_note"):  # Python 3.11+
                failure.add_note("(from a background write of training metrics reported earlier)")
            raise failure
        failure = self._tb_writes.take_failure()
        if failure is not None:
            assert self._tb_sync is not None
            raise errors.StorageError(
                f"Uploading TensorBoard files from {self._tb_sync.log_dir} to "
                f"{self._tb_sync.key} in the checkpoint storage failed: "
                f"{type(failure).__name__}: {str(failure).rstrip('.')}. Make the storage reachable and writable "
                "(the next report uploads every file not uploaded yet), or pass "
                "tensorboard_mode='MANUAL' to core.init and call "
                "train.upload_tensorboard_files() yourself."
            ) from failure

    def _upload_tensorboard(self, *, final: bool = False) -> None:
        """Queue an upload of the new TensorBoard files (``tensorboard_mode=AUTO``) on the
        upload thread: a report does not wait for the storage. At most one upload waits in the
        queue (it uploads whatever is new when it runs); ``final`` queues one regardless, for
        the files written after the last report."""
        sync = self._tb_sync
        assert sync is not None
        with self._tb_lock:
            if self._tb_queued and not final:
                return
            self._tb_queued = True

        def upload() -> None:
            with self._tb_lock:
                self._tb_queued = False
            sync.upload()

        self._tb_writes.submit(upload, f"upload TensorBoard files to {sync.key}")

    def _report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        self._raise_failed_write()
        if not isinstance(metrics, Mapping):
            raise errors.InvalidConfig(
                f"{group} metrics must be a dict of name -> value. "
                f"Received: metrics={type(metrics).__name__}."
            )
        steps = int_at_least("steps_completed", steps_completed, 0)
        if not self._is_chief:
            return
        clean = to_jsonable(dict(metrics))
        logger.debug("trial %s %s metrics at step %d: %s", self.trial_id, group, steps, clean)
        if self._registry is not None and group == TRAINING:
            # Queued: the database write held a Keras epoch end up 5-40 ms on loaded cores.
            registry, trial_id = self._registry, self.trial_id
            self._writes.submit(
                lambda: registry.report_metrics(trial_id, group, steps, clean),
                f"write trial {trial_id}'s training metrics at step {steps}",
            )
        elif self._registry is not None:
            self._writes.wait()  # after the queued training metrics (not the uploads)
            self._raise_failed_write()
            self._registry.report_metrics(self.trial_id, group, steps, clean)
        if self.tensorboard_mode is TensorboardMode.AUTO and self._tb_sync is not None:
            self._upload_tensorboard()

    def set_status(self, status: str) -> None:
        """Record what the trial is doing (``"training"``, ``"checkpointing"``...). Determined
        showed it in its web UI; here it is kept in :attr:`status` and logged at debug level."""
        if not isinstance(status, str):
            raise errors.InvalidConfig(f"status must be a string. Received: status={status!r}.")
        self._raise_failed_write()
        self.status = status
        logger.debug("trial %s status: %s", self.trial_id, status)

    def get_tensorboard_path(self) -> pathlib.Path:
        """A local folder for TensorBoard event files; its new files are copied to
        ``<storage>/tensorboard/<trial id>/`` by :meth:`upload_tensorboard_files` (and after
        every metrics report with ``tensorboard_mode=AUTO``, the default)."""
        if self._tb_sync is None:
            if self._storage is None:
                raise errors.InvalidConfig(
                    "This TrainContext has no storage to upload TensorBoard files to; create it "
                    "with ckptstore.core.init(storage=...)."
                )
            local = tempfile.mkdtemp(prefix=f"ckptstore-tb-{self.trial_id}-")
            self._tb_sync = TensorboardSync(self._storage, local, self.trial_id)
        return pathlib.Path(self._tb_sync.log_dir)

    def upload_tensorboard_files(
        self,
        selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, __: p,
    ) -> None:
        """Upload new or changed files of :meth:`get_tensorboard_path` (those ``selector``
        accepts) to ``<storage>/tensorboard/<trial id>/`` (chief only). ``mangler`` renamed
        files per rank in Determined; only the chief uploads here, so names are kept."""
        if not self._is_chief:
            return
        if self._tb_sync is None:
            self.get_tensorboard_path()
        assert self._tb_sync is not None
        self._tb_writes.wait()  # an AUTO upload still running: one upload at a time
        self._raise_failed_write()
        self._tb_sync.upload(selector)

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Say why the trial stops early (chief only): logged and kept in :attr:`early_exit`."""
        reason = check_mode(EarlyExitReason, reason, "reason")
        self._raise_failed_write()
        if self._is_chief:
            self.early_exit = reason
            logger.info("trial %s exits early: %s", self.trial_id, reason.name)

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: Mapping[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record training metrics after ``steps_completed`` batches (chief only).
        ``batch_metrics`` (per-batch values, Determined's profiler input) are not stored."""
        self._report(TRAINING, steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record validation metrics after ``steps_completed`` batches (chief only)."""
        self.report_metrics(VALIDATION, steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record metrics under any group name (chief only)."""
        self._report(group, steps_completed, metrics)
        if group == VALIDATION and self._is_chief:
            for hook in self._validation_hooks:
                hook(int(steps_completed), metrics)

    def report_progress(self, progress: float) -> None:
        """Log training progress in [0, 1] (there is no web UI to send it to)."""
        self._raise_failed_write()
        logger.debug("trial %s progress %.1f%%", self.trial_id, 100.0 * float(progress))

    def _metadata_storage(self) -> Storage:
        if self._storage is None:
            raise errors.InvalidConfig(
                "This TrainContext has no storage to keep the trial's metadata in; create it "
                "with ckptstore.core.init(storage=...)."
            )
        return self._storage

    def _metadata_key(self) -> str:
        return f"{TRIAL_METADATA_PREFIX}/{int(self.trial_id)}.json"

    def set_metadata(self, metadata: dict[str, Any]) -> dict[str, Any] | None:
        """Replace the trial's metadata (a dict of JSON values for analysis or debugging) and
        return what was stored, as Determined's ``set_metadata`` does on its master.

        The registry has no column for it, so it is kept beside the trial's TensorBoard files
        and logs, in ``<storage>/trial_metadata/<trial id>.json``: it outlives this context and
        any later context of the same trial (a resume) reads it back with :meth:`get_metadata`.
        Any worker may call it, as in Determined (the last write wins). Non-JSON values are
        converted like metrics (NumPy/tensors to numbers, non-finite floats to ``None``).
        """
        if not isinstance(metadata, Mapping):
            raise errors.InvalidConfig(
                "metadata must be a dict of name -> JSON value. "
                f"Received: metadata={type(metadata).__name__}."
            )
        clean = to_json(dict(metadata), what="trial metadata")
        assert isinstance(clean, dict)
        self._metadata_storage().write_bytes(
            self._metadata_key(), json.dumps(clean, sort_keys=True).encode("utf-8")
        )
        logger.debug("trial %s metadata set: %s", self.trial_id, clean)
        return clean

    def get_metadata(self) -> dict[str, Any] | None:
        """The trial's metadata as last given to :meth:`set_metadata` (by this or an earlier
        context of the trial), or None when none was ever set."""
        try:
            raw = self._metadata_storage().read_bytes(self._metadata_key())
        except errors.StorageNotFound:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            raise errors.InvalidConfig(
                f"The trial's metadata file {self._metadata_key()} is not valid JSON; "
                "set it again with set_metadata()."
            ) from None
        return value if isinstance(value, dict) else None

    def get_experiment_best_validation(self) -> float | None:
        """Best value of the searcher metric over the experiment's validations so far, or None
        (no experiment, no searcher metric, or no validation yet)."""
        self.wait()
        if self._registry is None or self.searcher_metric is None:
            return None
        trial_ids = [self.trial_id]
        if self.experiment_id is not None:
            trial_ids = [t.id for t in self._registry.list_trials(experiment_id=self.experiment_id)]
        # The one metric rule (checkpointing.metrics): finite numbers only, so a diverged
        # trial's NaN is never the experiment's best, and `val_` prefixes resolve as for GC.
        rows = [
            row for tid in trial_ids for row in self._registry.get_metrics(tid, group=VALIDATION)
        ]
        best = rank_by_metric(rows, self.searcher_metric, self.smaller_is_better)
        return metric_value(best[0].metrics, self.searcher_metric) if best else None

    def __repr__(self) -> str:
        return f"TrainContext(trial_id={self.trial_id})"


__all__ = ["EarlyExitReason", "TrainContext", "to_jsonable"]
