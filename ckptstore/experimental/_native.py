"""``det.experimental.test_one_batch(trial_class, config)``: Determined's quick local check of a
``TFKerasTrial`` — train one batch, validate, save a checkpoint — in a throw-away folder.

Example::

    from ckptstore import experimental

    experimental.test_one_batch(MyTrial, yaml.safe_load(open("const.yaml")))
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

from ckptstore import errors

logger = logging.getLogger(__name__)


def test_one_batch(trial_class: type, config: dict[str, Any] | None = None) -> Any:
    """Train ``trial_class`` for one batch, validate and checkpoint, with hyperparameters drawn
    from ``config`` (as ``TFKerasTrialContext.from_config`` does), on temporary local storage and
    registry. Returns the controller's result (``batches_trained``, ``last_validation``, ...).

    Raises what the trial raises, or :class:`~ckptstore.errors.InvalidConfig` for a bad config.
    """
    from ckptstore import core
    from ckptstore.keras_io.trial import TFKerasTrial, TFKerasTrialContext, TrialController

    if not (isinstance(trial_class, type) and issubclass(trial_class, TFKerasTrial)):
        raise errors.InvalidConfig(
            "test_one_batch needs a ckptstore.keras.TFKerasTrial subclass. "
            f"Received: {trial_class!r}."
        )
    config = dict(config or {})
    hparams = TFKerasTrialContext.from_config(config).get_hparams()
    searcher = dict(config.get("searcher") or {})
    # One batch, one validation, one checkpoint: Determined's test workloads.
    searcher.update(name="single", max_length={"batches": 1})
    searcher.setdefault("metric", "val_loss")
    searcher.pop("max_time", None)
    searcher.pop("time_metric", None)
    config.update(
        hyperparameters=hparams,  # the drawn values, as constants for the one-trial searcher
        searcher=searcher,
        scheduling_unit=1,
        min_validation_period={"batches": 1},
        entrypoint=config.get("entrypoint") or f"{trial_class.__module__}:{trial_class.__name__}",
    )
    logger.info("Running one batch of %s with hyperparameters %s", trial_class.__name__, hparams)
    with tempfile.TemporaryDirectory(prefix="ckptstore-test-one-batch-") as tmp:
        with core.init(
            storage=f"{tmp}/checkpoints",
            registry=f"sqlite:///{tmp}/registry.db",
            hparams=hparams,
            preempt_signals=False,
        ) as core_context:
            result = TrialController(trial_class, core_context, config).run()
    logger.info("The test experiment passed: %s", result.last_validation)
    return result


__all__ = ["test_one_batch"]
