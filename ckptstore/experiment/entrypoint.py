"""An experiment's ``entrypoint``: a TFKerasTrial class (``model_def:MNISTTrial``, also in
Determined's launcher form) or a script command (``python3 train.py``), parsed once with the
config; a command a shell cannot split is refused then, not when the runner starts a trial.

Example::

    from ckptstore.experiment.entrypoint import Entrypoint

    Entrypoint.parse("model_def:MNISTTrial", None).attr     # "MNISTTrial"
    Entrypoint.parse(["python3", "train.py"], None).command()   # ["python3", "train.py"]
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from ckptstore.experiment.keys import config_error

__all__ = ["Entrypoint"]

_ENTRYPOINT_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: Determined's legacy launcher form of a trial class:
#: ``python3 -m determined.launch.horovod --autohorovod --trial model_def:Trial``.
_LAUNCHED_CLASS = re.compile(
    r"^(?:python3?\s+)?-m\s+determined\.launch\.\w+(?:\s+--[\w-]+)*?\s+--trial\s+"
    r"(?P<cls>[A-Za-z_][\w.]*:[A-Za-z_][\w.]*)$"
)


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    """``model_def:MNISTTrial`` (a TFKerasTrial class) or a script command (``python3 train.py``)."""

    raw: str
    module: str | None = None
    attr: str | None = None

    @property
    def is_trial_class(self) -> bool:
        return self.module is not None

    def command(self) -> list[str]:
        """The script command split like a shell would (script entrypoints only)."""
        return shlex.split(self.raw)

    @classmethod
    def parse(cls, value: str | list[str] | None, script: str | list[str] | None) -> Entrypoint:
        """``entrypoint`` (else ``entrypoint_script``): a string or an argv list."""
        value = value if value is not None else script
        if isinstance(value, list) and value:
            value = shlex.join(value)
        if not isinstance(value, str) or not value.strip():
            raise config_error(
                "entrypoint",
                f"missing or empty (received {value!r})",
                "Set `entrypoint: model_def:MNISTTrial` or `entrypoint: python3 train.py`.",
            )
        value = value.strip()
        launched = _LAUNCHED_CLASS.match(" ".join(value.split()))
        if launched or _ENTRYPOINT_CLASS.match(value):
            module, attr = (launched.group("cls") if launched else value).split(":", 1)
            return cls(value, module, attr)
        try:  # the runner splits it for every trial: refuse now what it could not split then
            shlex.split(value)
        except ValueError as exc:
            raise config_error(
                "entrypoint",
                f"a shell cannot split this command ({exc}), received {value!r}",
                "Balance the quotes, e.g. `entrypoint: python3 train.py`.",
            ) from None
        return cls(value)
