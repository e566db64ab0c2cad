"""Checks on plain argument values, one owner each: "a real int (not bool) >= N" (optionally
<= M), "a finite real number (not bool) >= N" and "a string every database can store".

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
    "check_text",
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
    maximum: int | None = None,
) -> int:
    """``value`` if it is a real int >= ``minimum`` (and <= ``maximum``, when given: a
    database column's range); else ``error`` naming ``name``.

    ``hint`` is appended to the message (what to pass instead)."""
    ok = is_int(value) and minimum <= operator.index(value)  # type: ignore[arg-type]
    if ok and (maximum is None or operator.index(value) <= maximum):  # type: ignore[arg-type]
        return operator.index(value)  # type: ignore[arg-type]
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if minimum == 0:
        what = "a non-negative integer"
    if maximum is not None:
        what = f"an integer from {minimum} to {maximum}"
    raise error(f"{name} must be {what}. Received: {name}={value!r}{hint}")


def check_text(name: str, value: str, *, error: type[CkptstoreError] = InvalidConfig) -> str:
    """``value`` if every database can store it: no NUL character (PostgreSQL's text types
    cannot hold one) and no lone surrogate (not encodable as UTF-8); else ``error``."""
    if "\x00" in value:
        why = "contains a NUL character (\\x00), which PostgreSQL cannot store"
    else:
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            why = "is not valid Unicode (a lone surrogate)"
    raise error(f"{name} {why}; remove it. Received: {name}={value!r}")


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
