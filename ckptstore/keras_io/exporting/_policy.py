"""Which checkpoints get an inference SavedModel: :class:`ExportPolicy` (``DeterminedCallback(...,
export_saved_model=...)``), carried across a resume in the checkpoint's metadata."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.metrics import metric_value

logger = logging.getLogger(__name__)

MODES = ("final", "every", "best", "never")
#: Older spelling accepted for ``"every"``.
_ALIASES = {"all": "every"}


@dataclasses.dataclass
class ExportPolicy:
    """Which checkpoints get an inference SavedModel (``saved_model/``).

    - ``"final"``: the checkpoint at the end of training (not a preemption's);
    - ``"every"``: every checkpoint;
    - ``"best"``: a checkpoint whose ``metric`` is better than every earlier checkpoint's of the
      run (carried across a resume); ``metric`` defaults to ``val_loss``, or ``loss`` when
      ``fit()`` has no validation data;
    - ``"never"``: none (add one later with ``ckptstore checkpoint export UUID``).

    Example::

        DeterminedCallback(ctx, None, 1, export_saved_model=ExportPolicy(
            "best", metric="val_accuracy", smaller_is_better=False))
    """

    mode: str = "final"
    metric: str | None = None
    smaller_is_better: bool = True
    #: Best value of ``metric`` among this run's checkpoints so far (``"best"`` only).
    best: float | None = None

    def __post_init__(self) -> None:
        mode = _ALIASES.get(self.mode, self.mode) if isinstance(self.mode, str) else self.mode
        if mode not in MODES:
            raise errors.InvalidConfig(
                f"export_saved_model must be one of {MODES} or an ExportPolicy. "
                f"Received: export_saved_model={self.mode!r}"
            )
        self.mode = mode
        if self.metric is not None and not isinstance(self.metric, str):
            raise errors.InvalidConfig(
                f"ExportPolicy metric must be a metric name. Received: metric={self.metric!r}"
            )

    @classmethod
    def coerce(cls, value: str | ExportPolicy) -> ExportPolicy:
        """An :class:`ExportPolicy` from a mode name or a policy (copied)."""
        if isinstance(value, ExportPolicy):
            return dataclasses.replace(value)
        return cls(value)

    def wants(self, *, final: bool, metrics: Mapping[str, Any]) -> bool:
        """Whether the checkpoint being saved gets a SavedModel; updates ``best``."""
        if self.mode == "never":
            return False
        if self.mode == "every":
            return True
        if self.mode == "final":
            return final
        name = self.metric or ("val_loss" if "val_loss" in metrics else "loss")
        # the one metric rule (as GC's best-N and best_checkpoint): a NaN or inf is no value
        value = metric_value(metrics, name)
        if value is None:
            logger.warning(
                "export_saved_model='best': this checkpoint has no finite metric %r (has %s); "
                "no export.",
                name,
                sorted(metrics),
            )
            return False
        better = self.best is None or (
            value < self.best if self.smaller_is_better else value > self.best
        )
        if better:
            self.best = value
        return better

    def metadata(self) -> dict[str, Any]:
        """What a checkpoint records so a resumed run continues the same policy."""
        return {} if self.mode != "best" else {"saved_model_best": self.best}

    def resume_from(self, metadata: Mapping[str, Any]) -> None:
        """Continue a run: take ``best`` from the resumed checkpoint's metadata."""
        value = metadata.get("saved_model_best")
        if self.mode == "best" and isinstance(value, (int, float)):
            self.best = float(value)
