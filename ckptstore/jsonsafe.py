"""The one JSON policy for everything ckptstore stores as JSON: checkpoint metadata and metrics
(``metadata.json`` and the registry), reported training/validation metrics, hyperparameters.

The policy (the issue left the choice open; this is it):

- NaN, +inf and -inf become ``null``. A diverging run's ``val_loss`` must not make a checkpoint
  unsavable, and neither strict JSON nor PostgreSQL's ``json`` type has a spelling for them.
- Tensors and NumPy values become Python numbers / lists; tuples become lists.
- Mapping keys are ``str``; ``int`` keys become their decimal string as ``json.dumps`` would
  write them (``{3: x}`` -> ``{"3": x}``), and two keys that end up the same (``1`` and
  ``"1"``) are refused. Other keys, objects that are not numbers, strings that are not valid
  Unicode (lone surrogates) or hold a NUL character (PostgreSQL's JSON operators fail on it) and nesting
  deeper than :data:`MAX_DEPTH` raise :class:`~ckptstore.errors.InvalidConfig` naming the path.

Example::

    from ckptstore.jsonsafe import to_json

    to_json({"val_loss": float("nan"), "acc": 0.9})   # -> {"val_loss": None, "acc": 0.9}
    to_json({(1, 2): "x"})                              # raises InvalidConfig
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ckptstore.errors import InvalidConfig

__all__ = ["MAX_DEPTH", "to_json"]

#: Deepest nesting of dicts/lists accepted (Python's json and PostgreSQL both have limits;
#: real metadata is a few levels deep).
MAX_DEPTH = 100

JSON = Any  # None | bool | int | float | str | list[JSON] | dict[str, JSON]


def to_json(value: object, *, what: str = "value") -> JSON:
    """``value`` converted by the policy above; ``what`` names it in errors (e.g.
    ``"checkpoint metadata"``)."""
    return _convert(value, what, 0)


def _fail(path: str, why: str) -> InvalidConfig:
    return InvalidConfig(
        f"{path} is not JSON-serializable: {why}. Use str keys and plain values (numbers, "
        "strings, bools, None, lists, dicts); save other data as a file in the checkpoint."
    )


def _convert(value: object, path: str, depth: int) -> JSON:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail(path, f"the string {value!r} is not valid Unicode") from None
        if "\x00" in value:
            # PostgreSQL stores "\u0000" in a json column but then fails every JSON operator
            # on that row (and so every query scanning it): refused on both databases.
            raise _fail(path, f"the string {value!r} contains a NUL character (\\x00)")
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if depth >= MAX_DEPTH:
        raise _fail(path, f"it is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        out: dict[str, JSON] = {}
        for key, item in value.items():
            if isinstance(key, int) and not isinstance(key, bool):
                name = str(key)
            elif isinstance(key, str):
                name = _convert(key, path, depth)
            else:
                raise _fail(path, f"the key {key!r} is a {type(key).__name__}, not a str")
            if name in out:
                raise _fail(path, f"the keys {key!r} and {name!r} would be the same JSON key")
            out[name] = _convert(item, f"{path}[{key!r}]", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_convert(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if hasattr(value, "numpy") and callable(value.numpy):  # tf.Tensor / tf.Variable
        return _convert(value.numpy(), path, depth + 1)
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy scalar or array
        return _convert(value.tolist(), path, depth + 1)
    if hasattr(value, "__float__"):  # Decimal, Fraction, other number types
        try:
            return _convert(float(value), path, depth)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            pass
    raise _fail(path, f"a {type(value).__name__} is not a JSON value")


def env_json_object(raw: str, name: str) -> dict[str, Any]:
    """The JSON object held by environment variable ``name`` (its value ``raw``); raises
    :class:`~ckptstore.errors.InvalidConfig` naming the variable when it is not one."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidConfig(
            f"Environment variable {name} must hold a JSON object ({exc}); "
            f"set it like {name}='{{\"learning_rate\": 0.01}}'."
        ) from None
    if not isinstance(value, dict):
        raise InvalidConfig(
            f"Environment variable {name} must hold a JSON object, got a "
            f"{type(value).__name__}; set it like {name}='{{\"learning_rate\": 0.01}}'."
        )
    return value
