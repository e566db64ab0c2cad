"""Checks on plain argument values, one owner each: "a real int (not bool) >= N" and "a finite
real number (not bool) >= N".

Every public argument that must be a count, size, id or number of seconds is checked here, so
the rule (bools are refused, NaN/inf are refused, the error is :class:`InvalidConfig` saying
what was received) is the same everywhere.

Example::

    from ckptstore.validators import int_at_least, number_at_least

    concurrency = int_at_least("concurrency", 8, 1)          # -> 8
    timeout = number_at_least("timeout", 2.5, 0, strict=True)  # -> 2.5
    int_at_least("trial_id", True, 1)                        # raises InvalidConfig
"""

from __future__ import annotations

import enum
import math
import operator
from typing import TypeVar

from ckptstore.errors import CkptstoreError, InvalidConfig

__all__ = [
    "enum_member",
    "is_int",
    "is_number",
    "int_at_least",
    "optional_int_at_least",
    "number_at_least",
]

_E = TypeVar("_E", bound=enum.Enum)


def is_int(value: object) -> bool:
    """True for a real integer: an ``int`` or an integer type such as ``numpy.int64`` (anything
    with ``__index__``), but not ``True``/``False`` and never a float."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def is_number(value: object) -> bool:
    """True for a finite ``int``/``float`` that is not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def int_at_least(
    name: str,
    value: object,
    minimum: int,
    *,
    error: type[CkptstoreError] = InvalidConfig,
    hint: str = "",
) -> int:
    """``value`` if it is a real int >= ``minimum``; else ``error`` naming ``name``.

    ``hint`` is appended to the message (what to pass instead)."""
    if not is_int(value) or operator.index(value) < minimum:  # type: ignore[arg-type]
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if minimum == 0:
            what = "a non-negative integer"
        raise error(f"{name} must be {what}. Received: {name}={value!r}{hint}")
    return operator.index(value)  # type: ignore[arg-type]


def optional_int_at_least(
    name: str,
    value: object,
    minimum: int,
    *,
    error: type[CkptstoreError] = InvalidConfig,
) -> int | None:
    """Like :func:`int_at_least`, but ``None`` passes through."""
    return None if value is None else int_at_least(name, value, minimum, error=error)


def number_at_least(
    name: str,
    value: object,
    minimum: float,
    *,
    strict: bool = False,
    error: type[CkptstoreError] = InvalidConfig,
) -> float:
    """``float(value)`` if it is a finite number >= ``minimum`` (> with ``strict``)."""
    ok = is_number(value) and (value > minimum if strict else value >= minimum)  # type: ignore[operator]
    if not ok:
        relation = ">" if strict else ">="
        raise error(
            f"{name} must be a finite number {relation} {minimum:g}. Received: {name}={value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def enum_member(enum_cls: type[_E], value: object, name: str, where: str = "") -> _E:
    """``value`` as a member of ``enum_cls`` (a member, or its value string as Determined's
    configs spell it); InvalidConfig listing the members otherwise. ``where`` names the
    namespace the enum is public in (``"ckptstore.core."``)."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        raise InvalidConfig(
            f"{name} must be a {where}{enum_cls.__name__} "
            f"({', '.join(m.name for m in enum_cls)}). Received: {name}={value!r}."
        ) from None
