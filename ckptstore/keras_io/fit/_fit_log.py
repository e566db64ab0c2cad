"""What ``DeterminedCallback`` says during ``fit()``: ckptstore's INFO lines (one per committed
checkpoint, one per resume) and a summary when ``fit()`` ends.

They go through :mod:`logging` (logger ``ckptstore``). A program that configured logging
decides where they go; one that did not sees them on stderr while ``fit()`` runs with
``verbose`` not 0 (Keras' own switch for progress output), and not at all with ``verbose=0``.

Also: the warning when ``fit()`` starts fresh in a trial that holds checkpoints, and the
two-line error of a resume into a model of another shape.

Example::

    log = FitLog(callback.params, core_context, checkpoint=None, chief=True)
    ...
    log.end(resumed_from=None)   # the summary; the stderr handler (if any) goes
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import zipfile
from typing import Any, ClassVar

from ckptstore import errors
from ckptstore.checkpointing import jsonfiles
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _weights_view as weights_view

__all__ = [
    "FitLog",
    "log_resumed",
    "warn_second_restorer",
    "log_summary",
    "other_model",
    "show_during_fit",
    "stop_showing",
]

logger = logging.getLogger("ckptstore.keras_io.fit")
_ROOT = logging.getLogger("ckptstore")
#: A model config read for the message of :func:`other_model` (only its layer names are used).
_MAX_CONFIG_BYTES = 16 * 2**20


def show_during_fit(verbose: object) -> logging.Handler | None:
    """A stderr handler for ckptstore's INFO lines when ``verbose`` is not 0 and no handler
    would otherwise show them (none on the ``ckptstore`` loggers or the root logger)."""
    if verbose in (0, "0", False) or _ROOT.hasHandlers():
        return None
    handler = _LineHandler(sys.stderr, over_bar=verbose in (1, "1", "auto", True))
    handler.setFormatter(logging.Formatter("ckptstore: %(message)s"))
    handler.setLevel(logging.INFO)
    _ROOT.addHandler(handler)
    if _ROOT.level == logging.NOTSET or _ROOT.level > logging.INFO:
        handler._ckptstore_old_level = _ROOT.level  # type: ignore[attr-defined]
        _ROOT.setLevel(logging.INFO)
    return handler


class _LineHandler(logging.StreamHandler):
    """ckptstore's lines on stderr. With Keras's progress bar (``verbose=1``) on a terminal,
    a line first clears the bar Keras is drawing on the current line (it redraws it at its
    next update): appended to the bar, a line read ``loss: 0.8071ckptstore: Checkpoint ...``."""

    def __init__(self, stream: Any, over_bar: bool) -> None:
        super().__init__(stream)
        self.over_bar = over_bar

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        isatty = getattr(self.stream, "isatty", None)
        return "\r\x1b[K" + text if self.over_bar and isatty is not None and isatty() else text


def stop_showing(handler: logging.Handler | None) -> None:
    """Undo :func:`show_during_fit`."""
    if handler is None:
        return
    _ROOT.removeHandler(handler)
    old = getattr(handler, "_ckptstore_old_level", None)
    if old is not None:
        _ROOT.setLevel(old)


def storage_url(checkpoint_context: object) -> str:
    """The URL of the storage a core ``checkpoint`` context writes to ('' if it has none)."""
    storage = getattr(checkpoint_context, "storage", None)
    return str(getattr(storage, "url", "") or "")


class FitLog:
    """One ``fit()``'s log: the stderr handler it may add, what it saved and committed."""

    _warned: ClassVar[set[object]] = set()  # trials warned about once per process

    def __init__(self, params: Any, core: Any, checkpoint: str | None, chief: bool) -> None:
        self.handler = show_during_fit((params or {}).get("verbose", 1)) if chief else None
        self.core, self.chief = core, chief
        self.saves = 0
        self.committed: list[str] = []
        latest = getattr(getattr(core, "info", None), "latest_checkpoint", None)
        trial_id = getattr(core, "trial_id", None)
        if chief and checkpoint is None and latest is not None and trial_id not in self._warned:
            self._warned.add(trial_id)
            logger.warning(
                "Trial %s already holds checkpoints (the latest %s) and this fit() starts "
                "fresh (checkpoint=None): its checkpoints are added after them, and loading "
                "the trial's latest gives this run's model. For a separate run open a new "
                "trial (core.init() without trial_id); to resume pass "
                "checkpoint=core_context.info.latest_checkpoint.",
                trial_id,
                latest,
            )

    @classmethod
    def quiet(cls) -> FitLog:
        """A log for a callback outside ``fit()`` (says nothing)."""
        return cls(None, None, None, False)

    def end(self, resumed_from: str | None, fit_call: int = 0) -> None:
        """The summary line (chief), then the handler goes. ``fit_call`` counts the run's
        ``fit()`` calls from 0: a later call that did not resume continues the run."""
        try:
            if self.chief:
                log_summary(self.core.trial_id, self.saves, self.committed, resumed_from, fit_call)
        finally:
            stop_showing(self.handler)
            self.handler = None


def warn_second_restorer(callbacks: list[Any], keras: Any) -> None:
    """One warning when ``keras.callbacks.BackupAndRestore`` is in ``fit()``'s list too: both
    restore at ``fit()`` start, and whichever runs second overwrites the other's weights and
    first epoch while the run's other state (steps, RNGs, callbacks, the place in the data)
    comes from DeterminedCallback."""
    found = [cb for cb in callbacks if isinstance(cb, keras.callbacks.BackupAndRestore)]
    if found:
        logger.warning(
            "fit() has BackupAndRestore beside DeterminedCallback: after a crash both would "
            "restore, each its own state, and the run would continue from a mix of the two when "
            "they differ. "
            "Remove BackupAndRestore: DeterminedCallback resumes preempted and crashed runs "
            "(a preemption leaves BackupAndRestore nothing to restore: it deletes its backup "
            "when fit() stops)."
        )


def log_resumed(uuid: str, state: Any, batch: int, core: Any, epochs: int | None = None) -> None:
    """The one line a resume writes: which checkpoint, from where, the epoch and batch it
    continues at (``batch`` 0: the start of the epoch; none when ``fit(epochs=...)`` has no
    epoch left) and which worker says so."""
    epoch = int(state.epoch) + 1
    if batch:
        then = f"continuing at batch {batch + 1} of epoch {epoch}"
    elif epochs is not None and epoch > epochs:
        then = f"fit(epochs={epochs}) has no epoch left to train"
    else:
        then = f"continuing at the start of epoch {epoch}"
    distributed = getattr(core, "distributed", None)
    logger.info(
        "Resumed from checkpoint %s (%s): epoch %d, steps_completed %d; %s (worker %d of %d)",
        uuid,
        storage_url(getattr(core, "checkpoint", None)) or "storage",
        int(state.epoch),
        int(state.steps_completed),
        then,
        getattr(distributed, "rank", 0),
        getattr(distributed, "size", 1),
    )


def log_summary(
    trial_id: object,
    saved: int,
    committed: list[str],
    resumed_from: str | None,
    fit_call: int = 0,
) -> None:
    """The line ``fit()`` ends with: what this run saved, what of it is committed (the last
    checkpoint may still be uploading: ``core.init``'s exit waits for it) and where it
    started from."""
    if resumed_from:
        start = f"resumed from {resumed_from}"
    elif fit_call > 0:
        start = f"fit() call {fit_call + 1}, continuing the run"
    else:
        start = "started fresh"
    latest = f", the latest committed {committed[-1]}" if committed else ""
    logger.info(
        "fit() done for trial %s (%s): %d checkpoint(s) saved, %d committed%s%s.",
        trial_id,
        start,
        saved,
        len(committed),
        latest,
        f", {saved - len(committed)} still uploading" if saved > len(committed) else "",
    )


def _layers_word(names: list[str]) -> str:
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} layers)" if len(names) > 8 else "")
    return shown or "no layers"


def _saved_config(saved: str | weights_view.ChunkedFile) -> Any:
    """The model config a checkpoint holds: ``model.to_json()`` beside a Keras 2 checkpoint's
    weights (``saved`` a folder), or the ``config.json`` of a ``.keras`` file (a path, or the
    in-place view of one a resume reads from its chunks)."""
    if isinstance(saved, str) and os.path.isdir(saved):
        with open(os.path.join(saved, keras2_format.MODEL_CONFIG_FILENAME), "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
    else:
        source = saved if isinstance(saved, str) else weights_view.RangeFile.whole(saved)
        with zipfile.ZipFile(source) as archive, archive.open("config.json") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
    return jsonfiles.load_json(data, str(getattr(saved, "name", saved)), _MAX_CONFIG_BYTES)


def _saved_layers(saved: str | weights_view.ChunkedFile) -> str:
    """The layers of the model a ``.keras`` file or a Keras 2 checkpoint folder holds, read
    from its config (no weights)."""
    try:
        config = _saved_config(saved)
        layers = config.get("config", {}).get("layers", [])
        words = [  # model.layers leaves the InputLayer out: so does this
            _layer(entry["class_name"], entry.get("config", {}))
            for entry in layers
            if entry.get("class_name") != "InputLayer"
        ]
        return f"{config.get('class_name', 'Model')} [{_layers_word(words)}]"
    except (
        OSError,
        KeyError,
        ValueError,
        zipfile.BadZipFile,
        AttributeError,
        TypeError,
        errors.InvalidCheckpoint,
    ):
        return "a model whose config it does not hold"


def _layer(class_name: str, config: dict[str, Any]) -> str:
    size = config.get("units", config.get("filters"))
    return f"{class_name}({size})" if size is not None else class_name


def _live_layers(model: Any) -> str:
    words = [_layer(type(layer).__name__, vars(layer)) for layer in getattr(model, "layers", [])]
    return f"{type(model).__name__} [{_layers_word(words)}]"


def other_model(
    uuid: str, saved: str | weights_view.ChunkedFile, model: Any, core: Any
) -> errors.ResumeError:
    """The two-line error of a resume or warm start into a model of another shape: which trial
    and checkpoint hold which model, and how to start fresh (Keras' own message dumps weights).
    ``saved``: the checkpoint's ``.keras`` file (or its in-place view), or its folder for a
    Keras 2 checkpoint.

    Deleting the trial is suggested only when the checkpoint is the running trial's own: a warm
    start from another trial's checkpoint must not suggest deleting that trial."""
    running = getattr(core, "trial_id", None)
    holder = running
    with contextlib.suppress(Exception):
        holder = core.registry.get_checkpoint(uuid).trial_id
    if holder is not None and holder == running:
        fresh = (
            "To start fresh pass checkpoint=None in a new trial (core.init() without trial_id), "
            f"or delete trial {holder} first: ckptstore trial delete {holder} --yes"
        )
    else:
        fresh = (
            f"To start fresh pass checkpoint=None (this run is trial {running}); to warm start, "
            "pass a checkpoint of a model built like this one."
        )
    of_trial = f" of trial {holder}" if holder is not None else ""
    return errors.ResumeError(
        f"Checkpoint {uuid}{of_trial} holds {_saved_layers(saved)}; fit() was given "
        f"{_live_layers(model)}: its weights do not fit this model.\n{fresh}"
    )
