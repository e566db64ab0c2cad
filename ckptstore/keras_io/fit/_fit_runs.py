"""One training run's ``fit()`` calls, counted per process whichever ``DeterminedCallback``
each call was given.

A script may call ``fit()`` several times (train a head on a frozen base, unfreeze, recompile,
``fit()`` again; ``fit(epochs=1)`` in a loop), and may give each call a new callback built the
same way (``DeterminedCallback(ctx, ctx.info.latest_checkpoint, trial_id)``) instead of
reusing one. Keras users write both; both must resume alike. So what one call hands to the next
(which call of the run this is, the checkpoint the process resumes from and whether it was
read, the preemption, ``steps_completed``, the finished calls' ``History``, the ``"best"``
export policy's value) is kept here, per core context and ``continue_id`` (the run), not on
the callback object: a callback taking over a run starts from what the previous one left.

A callback given a checkpoint other than ``None``, the one the run resumed from in this process,
or the newest one this run committed for the same model object is an explicit restore: it
reads that checkpoint, and the run's ``fit()`` calls are still counted on.

:func:`fit_callbacks` finds the callbacks of the ``fit()`` call running now.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import sys
import weakref
from typing import Any

from ckptstore.keras_io import backend

logger = logging.getLogger(__name__)

__all__ = ["FitRun", "fit_callbacks", "run_of"]

_tokens = itertools.count(1)


@dataclasses.dataclass
class FitRun:
    """What a run's next ``fit()`` call takes over from the one before it in this process."""

    #: Index of the last ``fit()`` call started (-1: none yet).
    fit_call: int = -1
    #: The checkpoint the run resumes from in this process, and whether a call read it.
    checkpoint: str | None = None
    loaded: bool = False
    preempted: bool = False
    steps_completed: int = 0
    last_reported_steps: int = 0
    fit_histories: list[Any] = dataclasses.field(default_factory=list)
    saved_histories: list[Any] = dataclasses.field(default_factory=list)
    #: The newest checkpoint committed by the run in this process, and the model it holds.
    last_committed: str | None = None
    model: Any = None  # a weakref.ref
    #: ``ExportPolicy.metadata()`` (the ``"best"`` value so far).
    export_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``token`` of the callback that last handed its state over (0: none yet).
    owner: int = 0


#: core context -> run key (``continue_id`` as JSON) -> FitRun. Weak: a closed context and
#: its runs go away together (a FitRun holds no reference to the context).
_RUNS: weakref.WeakKeyDictionary[Any, dict[str, FitRun]] = weakref.WeakKeyDictionary()


def new_token() -> int:
    """A callback's identity in :attr:`FitRun.owner` (ids of dead objects are reused)."""
    return next(_tokens)


def run_of(core_context: Any, continue_id_json: Any) -> FitRun | None:
    """The run of ``continue_id`` on ``core_context`` (created empty), or None for a context
    that cannot be keyed weakly (then every callback counts its own calls)."""
    try:
        runs = _RUNS.setdefault(core_context, {})
    except TypeError:
        return None
    return runs.setdefault(json.dumps(continue_id_json, sort_keys=True), FitRun())


def follows_run(run: FitRun, checkpoint: str | None, model: Any) -> bool:
    """Whether a callback given ``checkpoint`` continues ``run`` as it stands in this process
    (else it restores ``checkpoint`` explicitly): ``None``, the checkpoint the run resumed
    from, or the newest checkpoint it committed for this same ``model`` (the model holds it)."""
    if checkpoint is None or checkpoint == run.checkpoint:
        return True
    held = run.model() if run.model is not None else None
    return checkpoint == run.last_committed and held is model


def model_ref(model: Any) -> Any:
    try:
        return weakref.ref(model)
    except TypeError:
        return None


def fit_callbacks(me: Any) -> list[Any]:
    """The callbacks of the running ``fit()``: found on the ``CallbackList`` calling ``me``.

    Keras gives a callback no handle on its siblings; ``CallbackList.on_train_begin`` is the
    caller, so its ``self`` is looked up a few frames up the stack.
    """
    CallbackList = backend.keras.callbacks.CallbackList  # noqa: N806 - a class

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, CallbackList) and me in candidate.callbacks:
            return list(candidate.callbacks)
        frame = frame.f_back
    logger.warning(
        "Could not find the fit() callback list; other callbacks' state will not be saved."
    )
    return [me]
