"""The callback events a TFKerasTrial's callbacks get, in Determined's order and with its logs.

Determined 0.38.1 drives a trial's callbacks through ``_MultiplexerBase``
(``harness/determined/keras/callbacks.py``) and ``TFKerasTrialController``
(``harness/determined/keras/_tf_keras_trial.py``); :class:`~.controller.TrialController`
follows them:

- ``on_epoch_begin`` and ``on_train_workload_begin`` come at the first batch of a workload, in
  that order (``_check_epoch_begin`` then ``_check_train_workload_begin`` in
  ``on_train_batch_begin``);
- ``on_train_workload_end(batches, logs)``: the workload's training metrics plus ``batches``
  and ``epochs`` (``_post_train_batch_end``), after that batch's ``on_train_batch_end`` and any
  ``on_epoch_end``;
- ``on_test_end`` comes once evaluation is over, with the ``val_`` metrics (reduced across
  workers; ``batches`` and ``epochs`` are added only after it, for the report:
  ``_compute_validation_metrics``); Keras's own ``on_test_end`` of ``evaluate()`` (its raw,
  unprefixed logs) is not passed on (``_MultiplexerBase.on_test_end`` drops it).

Example::

    evaluate_callbacks = TestEndLater(user_callbacks, add_history=False, add_progbar=False)
    model.evaluate(x, y, callbacks=evaluate_callbacks)
    workload_hook(user_callbacks, "on_test_end", val_metrics)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptstore.keras_io.backend import keras


class TestEndLater(keras.callbacks.CallbackList):
    """The callbacks of ``evaluate()`` without its ``on_test_end``: the controller calls it
    after evaluation, with the ``val_`` metrics."""

    __test__ = False  # not a pytest class, whatever its name

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        # Keras 3's list counts begin/end pairs (its async executor): end the pair, call none
        kept, self.callbacks = self.callbacks, []
        try:
            super().on_test_end(logs)
        finally:
            self.callbacks = kept


def workload_hook(callbacks: list[Any], name: str, *args: Any) -> None:
    """Call hook ``name`` (Determined's workload hooks, ``on_test_end``) on every callback
    that has it."""
    for cb in callbacks:
        hook = getattr(cb, name, None)
        if callable(hook):
            hook(*args)


def counts(batches: int, batches_per_epoch: int | None) -> dict[str, int]:
    """Determined's ``batches`` and ``epochs`` (completed) in its callbacks' logs."""
    return {
        "batches": batches,
        "epochs": batches // batches_per_epoch if batches_per_epoch else 0,
    }


def to_float(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return np.asarray(value).item()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy()).item()
    return value


def mean_logs(logs: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each metric over a workload's batch logs."""
    if not logs:
        return {}
    out = {}
    for key in logs[-1]:
        values = [float(to_float(entry[key])) for entry in logs if key in entry]
        out[key] = float(np.mean(values))
    return out


__all__ = ["TestEndLater", "counts", "mean_logs", "to_float", "workload_hook"]
