"""Query-string parsing shared by the pages: bad values are a 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request

from ckptstore import errors
from ckptstore.checkpointing.index import STATES

RUN_STATES = ("ACTIVE", "PAUSED", "COMPLETED", "CANCELED", "ERROR")
CHECKPOINT_STATES = STATES  # one owner: ckptstore.checkpointing.index (includes DELETING)


def _bad(name: str, value: str, what: str) -> errors.InvalidConfig:
    return errors.InvalidConfig(f"Query parameter {name!r} must be {what}. Received: {value!r}")


def int_param(request: Request, name: str, default: int, low: int = 1) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(name, raw, "an integer") from None
    if value < low or value > 10**9:
        raise _bad(name, raw, f"an integer >= {low}")
    return value


def float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _bad(name, raw, "a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise _bad(name, raw, "a finite number")
    return value


def choice_param(request: Request, name: str, choices: Sequence[str]) -> str | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    if raw not in choices:
        raise _bad(name, raw, f"one of {', '.join(choices)}")
    return raw
