"""Training lengths: the one length type, what the YAML says (``{batches: N}``, ``{records: N}``,
``{epochs: N}`` or a bare integer of Determined's older "steps") and what the runner and the
trials use (``Length("batches", 100)``, :meth:`Length.to_batches`).

A length is checked where it is written (one unit, not negative); the config's rules, which know
``scheduling_unit``, turn steps into batches with :func:`in_batches` (a length of 0 refused) or
:func:`period` (0 is "never"). The class docstring is the published schema's description.

Example::

    from ckptstore.experiment.lengths import parse_length

    parse_length(5, "searcher.max_length", scheduling_unit=100).to_dict()   # {"batches": 500}
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

from ckptstore import errors
from ckptstore.experiment.keys import (
    NonNegativeInt,
    PositiveInt,
    Section,
    config_error,
    validate_as,
)

__all__ = ["LENGTH_UNITS", "Length", "LengthField", "in_batches", "parse_length", "period"]

LENGTH_UNITS = ("batches", "records", "epochs")
LENGTH_FIX = "Set e.g. `max_length: {batches: 1000}`."


class LengthSpec(Section):
    """``{batches: N}``, ``{records: N}`` or ``{epochs: N}``; 0 means "never" for periods."""

    batches: NonNegativeInt | None = None
    records: NonNegativeInt | None = None
    epochs: NonNegativeInt | None = None

    def __init__(self, unit: str | None = None, value: int | None = None, /, **given: Any):
        super().__init__(**({unit: value} if unit is not None else given))

    @model_validator(mode="after")
    def _one_unit(self) -> LengthSpec:
        if len(self.model_fields_set) != 1:
            raise PydanticCustomError(
                "one_unit",
                "expected exactly one of batches, records, epochs",
                {"fix": "Write it like `{batches: 100}`."},
            )
        return self

    @property
    def unit(self) -> str:
        return next(iter(self.model_fields_set))

    @property
    def value(self) -> int:
        return getattr(self, self.unit)

    def to_batches(self, global_batch_size: int, records_per_epoch: int | None) -> int:
        """The length in batches as Determined's trial harness counts it: records and epochs
        round down to whole batches, at least 1 (``records_per_epoch: 50000`` and
        ``global_batch_size: 48`` make an epoch of 1041 batches)."""
        if self.unit == "batches":
            return self.value
        if self.unit == "records":
            return max(1, self.value // global_batch_size)
        if not records_per_epoch:
            raise errors.InvalidConfig(
                f"A length of {{epochs: {self.value}}} needs the number of records per epoch. "
                "Set `records_per_epoch` in the experiment config, or use a training data loader "
                "whose length is known (NumPy arrays or a Sequence)."
            )
        return max(1, self.value * records_per_epoch // global_batch_size)

    def to_dict(self) -> dict[str, int]:
        return {self.unit: self.value}


#: The one length type (the published schema names it ``LengthSpec``).
Length = LengthSpec


def _length_tag(value: Any) -> str:
    return (
        "length:steps" if isinstance(value, int) and not isinstance(value, bool) else "length:unit"
    )


#: A :class:`Length`, or a bare integer of Determined's older "steps" unit (``N *
#: scheduling_unit`` batches, converted by the config's rules, which know the unit).
LengthField = Annotated[
    Annotated[PositiveInt, Tag("length:steps")] | Annotated[LengthSpec, Tag("length:unit")],
    Discriminator(_length_tag),
]


def in_batches(value: int | Length, key: str, scheduling_unit: int) -> Length:
    """Steps (a bare int) in batches; a length of 0 refused."""
    if isinstance(value, int):  # Determined's older unit: steps of scheduling_unit batches
        return Length("batches", value * scheduling_unit)
    if value.value == 0:
        raise config_error(
            f"{key}.{value.unit}", "expected a positive integer, received 0", "Set e.g. 100."
        )
    return value


def period(value: int | Length | None, scheduling_unit: int) -> Length | None:
    """A period as a :class:`Length`; None when absent or 0 ("never")."""
    if value is None or (isinstance(value, Length) and value.value == 0):
        return None
    return in_batches(value, "", scheduling_unit)


_LENGTH = TypeAdapter(LengthField)


def parse_length(value: Any, key: str, scheduling_unit: int) -> Length:
    """``{batches|records|epochs: N}`` or a bare int of steps (``N * scheduling_unit`` batches)."""
    return in_batches(validate_as(_LENGTH, value, key), key, scheduling_unit)
