"""The exports of one ``DeterminedCallback``'s checkpoints (:class:`CheckpointExports`): which
checkpoint gets one, the hook that runs it in the worker before the writer commits, and the
finishers that let ``fit()`` return while the last export is still running."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Mapping
from typing import Any

from ckptstore import errors
from ckptstore.keras_io.exporting._best_effort import (
    SAVED_MODEL,
    Shortfalls,
    export_live,
    live_export_blocker,
    live_export_fix,
    reason_of,
)
from ckptstore.keras_io.exporting._policy import ExportPolicy
from ckptstore.keras_io.exporting._savedmodel import custom_modules
from ckptstore.keras_io.exporting._worker import ExportWorker
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME, SAVED_MODEL_DIRNAME

logger = logging.getLogger(__name__)


class CheckpointExports:
    """What ``DeterminedCallback`` uses: the policy, and the hook that exports a checkpoint in
    the worker process before the writer commits it.

    ``fit()`` does not wait for an export: when a checkpoint with an export is still being
    written at the end of ``fit()``, :meth:`detach` hands the writer and the worker over to a
    finisher that :meth:`wait`, the core context's ``close()``/``checkpoint.wait()`` and
    interpreter exit all run (whichever comes first does the waiting).

    Example::

        exports = CheckpointExports("every")
        job.before_commit = exports.hook(final=False, preempted=False, metrics=logs,
                                         config_json=layout.config_json)
    """

    def __init__(self, policy: str | ExportPolicy) -> None:
        self.policy = ExportPolicy.coerce(policy)
        self._worker: ExportWorker | None = None
        self._modules: tuple[str, list[str]] | None = None
        self._finishers: list[_Finisher] = []
        #: What this run's checkpoints lack (one warning per artifact per run).
        self.shortfalls = Shortfalls()
        #: Whether a checkpoint with an export was handed to the writer since the last detach.
        self.submitted = False

    def hook(
        self,
        *,
        final: bool,
        preempted: bool,
        metrics: Mapping[str, Any],
        config_json: str,
        keras2: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> Any:
        """The writer's ``before_commit`` for this checkpoint, or None if it gets no export.
        A preemption's checkpoint never does: the run must stop quickly, the resumed run's
        checkpoints export as the policy says. ``keras2``: the checkpoint is a Keras 2 one
        (``model_checkpoint.*`` + ``model_config.json``), exported by a Keras 2 worker.
        A failed export is best effort: the checkpoint commits without ``saved_model/`` and
        ``metadata`` (the checkpoint's, still open) records why."""
        if preempted or not self.policy.wants(final=final, metrics=metrics):
            return None
        if self._modules is None or self._modules[0] != config_json:
            self._modules = (config_json, custom_modules(config_json))
        modules = self._modules[1]
        if self._worker is None:
            self._worker = ExportWorker(keras2=keras2)
        worker = self._worker
        self.submitted = True

        def before_commit(path: str) -> None:
            out = os.path.join(path, SAVED_MODEL_DIRNAME)
            try:
                if keras2:
                    result = worker.export_keras2(path, out, modules=modules)
                else:
                    model_file = os.path.join(path, MODEL_FILENAME)
                    result = worker.export(model_file, out, modules=modules)
            except Exception as exc:  # noqa: BLE001 - a secondary artifact never fails the run
                shutil.rmtree(out, ignore_errors=True)
                self.shortfalls.record(
                    metadata if metadata is not None else {}, SAVED_MODEL, reason_of(exc)
                )
                return
            logger.info(
                "SavedModel exported and verified in %.2f s (max |serve - keras| %.2g)",
                result.seconds,
                result.max_abs_diff or 0.0,
            )

        return before_commit

    def export_here(
        self,
        model: Any,
        out: str,
        *,
        final: bool,
        preempted: bool,
        metrics: Mapping[str, Any],
        metadata: dict[str, Any],
        why: str | None,
    ) -> bool:
        """The fallback for a model no worker process can rebuild (``why``): export the live
        ``model`` to ``out`` on the training thread when the policy wants one (best effort: a
        failure is recorded in ``metadata``). Whether it did."""
        if preempted or not self.policy.wants(final=final, metrics=metrics):
            return False
        fix = live_export_fix()
        blocker = live_export_blocker()
        if blocker is not None:  # not tried: fit() would wait for an export bound to fail
            self.shortfalls.record(metadata, SAVED_MODEL, f"{why}; {blocker}", fix)
            return False
        logger.warning(
            "SavedModel exported on the training thread (fit() waits for it): %s, "
            "which the export worker process cannot rebuild.",
            why,
        )
        try:
            export_live(model, out)
        except Exception as exc:  # noqa: BLE001 - a secondary artifact never fails the run
            shutil.rmtree(out, ignore_errors=True)
            self.shortfalls.record(metadata, SAVED_MODEL, reason_of(exc), fix)
            return False
        return True

    def prestart(self) -> None:
        """Start the worker at the beginning of ``fit()`` when most checkpoints may export
        (``"every"``, ``"best"``), so its start overlaps training instead of delaying the
        first export; ``"final"`` starts it at the final checkpoint."""
        if self.policy.mode in ("every", "best"):
            if self._worker is None:
                self._worker = ExportWorker()
            self._worker.start()

    def resume_from(self, checkpoint_context: Any, uuid: str) -> None:
        """Carry the ``"best"`` policy's best value over from the checkpoint resumed from."""
        if self.policy.mode != "best":
            return
        try:
            self.policy.resume_from(checkpoint_context.get_metadata(uuid))
        except errors.CkptstoreError as exc:
            logger.warning("Could not read the best exported metric of %s: %s", uuid, exc)

    def detach(self, writer: Any, checkpoint_context: Any) -> None:
        """Let ``writer`` (and the worker) finish in the background; see the class docstring."""
        finisher = _Finisher(writer, self._worker)
        self._worker = None
        self.submitted = False
        self._finishers.append(finisher)
        defer = getattr(checkpoint_context, "defer", None)
        if callable(defer):
            defer(finisher.wait)
        import atexit

        atexit.register(finisher.wait_quietly)

    def wait(self) -> None:
        """Block until every detached writer committed; raise the first failure."""
        finishers, self._finishers = self._finishers, []
        first: BaseException | None = None
        for finisher in finishers:
            try:
                finisher.wait()
            except BaseException as exc:  # noqa: BLE001 - raised below, after all finished
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        """Stop the worker of the current (not detached) writer."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


class _Finisher:
    """Waits once for a detached writer, then closes it and its export worker."""

    def __init__(self, writer: Any, worker: ExportWorker | None) -> None:
        self._writer = writer
        self._worker = worker
        self._lock = threading.Lock()
        self._done = False

    def wait(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                self._writer.wait()
            finally:
                self._writer.close()
                if self._worker is not None:
                    self._worker.close()

    def wait_quietly(self) -> None:
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - at interpreter exit there is no caller left
            logger.error("A checkpoint finishing at exit failed: %s", exc)
