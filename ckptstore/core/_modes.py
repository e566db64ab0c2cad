"""Determined's Core API mode enums: ``PreemptMode`` and ``TensorboardMode`` (same names, values).

Example::

    import ckptstore as det

    with det.core.init(preempt_mode=det.core.PreemptMode.ChiefOnly) as core_context:
        ...
"""

from __future__ import annotations

import enum
from typing import TypeVar

from ckptstore.validators import enum_member

_E = TypeVar("_E", bound=enum.Enum)


class PreemptMode(enum.Enum):
    """Who asks whether to stop. ``WorkersAskChief`` (default): every worker calls
    ``should_preempt()`` and all get the chief's answer. ``ChiefOnly``: only the chief may call it.
    ``WorkersAskMaster``: there is no master here; behaves like ``WorkersAskChief`` (every worker
    gets the same answer, which is what asking the master gave)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class TensorboardMode(enum.Enum):
    """``AUTO``: ``train.report_*_metrics`` also uploads new files of
    ``train.get_tensorboard_path()`` to ``<storage>/tensorboard/<trial id>/``. ``MANUAL``: only
    ``train.upload_tensorboard_files()`` does."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


def check_mode(enum_cls: type[_E], value: _E | str, argument: str) -> _E:
    """``value`` as a member of ``enum_cls`` (a member or its value string)."""
    return enum_member(enum_cls, value, argument, "ckptstore.core.")


__all__ = ["PreemptMode", "TensorboardMode", "check_mode"]
