"""The hyperparameter space: the types of the ``hyperparameters`` section (Determined's
``const``, ``categorical``, ``int``, ``double``, ``log`` and nested groups) as pydantic models,
which are also what the searcher and the trials draw from: a validated section is a flat list of
named hyperparameters with their grid values.

Example::

    from ckptstore.experiment.hparams import parse_hyperparameters

    [lr] = parse_hyperparameters({"lr": {"type": "log", "minval": -3, "maxval": -1, "count": 3}})
    lr.name, lr.grid_values()     # ("lr", [0.001, 0.01, 0.1])
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from ckptstore.experiment.keys import Number, PositiveInt, Section, config_error, validate_as
from ckptstore.yamlsafe import check_size

__all__ = ["HP_TYPES", "Hyperparameter", "Hyperparameters", "nest_hparams", "parse_hyperparameters"]

#: Hyperparameter types.
HP_TYPES = ("const", "int", "double", "log", "categorical")


class _HP(Section):
    """One hyperparameter; :attr:`name` is its dotted path (nested groups joined by ``.``)."""

    _name: str = PrivateAttr("")

    @property
    def name(self) -> str:
        return self._name

    def grid_size(self) -> int:
        """How many values a grid search tries, computed without listing them."""
        return len(self.grid_values())

    def grid_values(self) -> list[Any]:
        """The values a grid search tries."""
        raise NotImplementedError


class ConstHP(_HP):
    """A hyperparameter with one value: ``{type: const, val: 0.9}``."""

    type: Literal["const"]
    val: Any

    def grid_values(self) -> list[Any]:
        return [self.val]


class CategoricalHP(_HP):
    """One of a list of values: ``{type: categorical, vals: [relu, tanh]}``."""

    type: Literal["categorical"]
    vals: Annotated[list[Any], Field(min_length=1)]

    def grid_values(self) -> list[Any]:
        return list(self.vals)


class _RangeHP(_HP):
    """A range; ``count`` points of it for the grid searcher."""

    count: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _RangeHP:
        low, high = self.minval, self.maxval  # type: ignore[attr-defined]
        if low > high:
            raise PydanticCustomError(
                "range_order",
                "minval {low} is greater than maxval {high}",
                {"low": low, "high": high, "fix": "Swap them so minval <= maxval."},
            )
        return self

    def grid_size(self) -> int:
        assert self.count is not None
        if isinstance(self, IntHP):
            return min(self.count, self.maxval - self.minval + 1)
        return self.count

    def grid_values(self) -> list[Any]:
        """``count`` evenly spaced points of the range."""
        low, high, count = self.minval, self.maxval, self.count  # type: ignore[attr-defined]
        assert count is not None
        if isinstance(self, IntHP) and count > high - low + 1:
            # Points closer than 1 apart round to every integer of the range: list those.
            return list(range(int(low), int(high) + 1))
        if count == 1:
            points = [(low + high) / 2]
        else:
            step = (high - low) / (count - 1)
            points = [low + i * step for i in range(count)]
        if isinstance(self, IntHP):
            return sorted({int(round(p)) for p in points})
        if isinstance(self, LogHP):
            return [float(self.base**p) for p in points]
        return [float(p) for p in points]


class IntHP(_RangeHP):
    """An integer in ``[minval, maxval]``: ``{type: int, minval: 8, maxval: 64}``."""

    type: Literal["int"]
    minval: int
    maxval: int


class DoubleHP(_RangeHP):
    """A float in ``[minval, maxval]``: ``{type: double, minval: 0.0, maxval: 0.5}``."""

    type: Literal["double"]
    minval: Number
    maxval: Number


class LogHP(_RangeHP):
    """``base ** x`` for x in ``[minval, maxval]``: ``{type: log, minval: -4, maxval: -1}``."""

    type: Literal["log"]
    minval: Number
    maxval: Number
    base: Annotated[Number, Field(gt=0)] = 10.0

    @model_validator(mode="after")
    def _base_not_one(self) -> LogHP:
        if self.base == 1:
            raise PydanticCustomError("log_base", "base 1 has no logarithm", {"fix": "Use 10."})
        return self


def _hp_tag(value: Any) -> str:
    if not isinstance(value, dict):
        return "hp:plain"
    if "type" not in value:
        return "hp:group"
    return f"hp:{value['type']}" if value["type"] in HP_TYPES else "unknown"


HPName = Annotated[str, Field(min_length=1, pattern=r"^[^.]+$")]
#: pydantic writes a key pattern as ``patternProperties``, which lets other keys through.
_HP_NAMES = {"propertyNames": {"minLength": 1, "pattern": r"^[^.]+$"}}
HPSpec = TypeAliasType(
    "HPSpec",
    Annotated[
        Annotated[ConstHP, Tag("hp:const")]
        | Annotated[CategoricalHP, Tag("hp:categorical")]
        | Annotated[IntHP, Tag("hp:int")]
        | Annotated[DoubleHP, Tag("hp:double")]
        | Annotated[LogHP, Tag("hp:log")]
        # The schema says what the discriminator does, so exactly one branch matches:
        # a mapping without `type` is a group; anything but a mapping is a constant.
        | Annotated[
            dict[HPName, "HPSpec"],
            Field(min_length=1, json_schema_extra={"not": {"required": ["type"]}, **_HP_NAMES}),
            Tag("hp:group"),
        ]
        | Annotated[Any, WithJsonSchema({"not": {"type": "object"}}), Tag("hp:plain")],
        Discriminator(
            _hp_tag,
            custom_error_type="hp_type",
            custom_error_message="unknown hyperparameter type",
            custom_error_context={"expected": ", ".join(map(repr, HP_TYPES))},
        ),
    ],
)

#: Any hyperparameter as the searcher and the trials see it.
Hyperparameter = ConstHP | CategoricalHP | IntHP | DoubleHP | LogHP


def _flatten(specs: dict[str, Any], prefix: str = "") -> list[Hyperparameter]:
    """Nested groups as one list of named hyperparameters; a plain value is a constant."""
    out: list[Hyperparameter] = []
    for name, spec in specs.items():
        if isinstance(spec, dict):
            out += _flatten(spec, f"{prefix}{name}.")
            continue
        if not isinstance(spec, _HP):
            spec = ConstHP.model_construct(type="const", val=spec)
        spec._name = f"{prefix}{name}"
        out.append(spec)
    return out


#: The ``hyperparameters`` section, validated into a flat list of named hyperparameters.
Hyperparameters = Annotated[
    dict[HPName, HPSpec], Field(json_schema_extra=_HP_NAMES), AfterValidator(_flatten)
]


_HYPERPARAMETERS = TypeAdapter(Hyperparameters)


def parse_hyperparameters(raw: Any) -> list[Hyperparameter]:
    """The ``hyperparameters`` section as a flat list of named hyperparameters."""
    if raw is not None and not isinstance(raw, dict):
        raise config_error(
            "hyperparameters",
            f"expected a mapping of names to values or specs, received {type(raw).__name__}",
            "Write it like `hyperparameters: {global_batch_size: 32}`.",
        )
    check_size(raw, "hyperparameters")
    return [] if raw is None else validate_as(_HYPERPARAMETERS, raw, "hyperparameters")


def nest_hparams(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (nested groups as the trial sees them)."""
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested
