"""What every key of an experiment config shares: the section base (strict types, no unknown
keys, Determined's ignored keys declared from a table) and the one wording of a bad key.

The config's sections (:mod:`~ckptstore.experiment.config_schema`), its hyperparameters
(:mod:`~ckptstore.experiment.hparams`) and the whole config
(:class:`~ckptstore.experiment.config.ExperimentConfig`) are :class:`Section`\\ s; a problem in
any of them reaches the user as one :class:`~ckptstore.errors.InvalidConfig` naming the dotted
key, what was wrong, the value received and a fix (:func:`as_invalid_config` for pydantic's
errors, :func:`config_error` for the rules between keys).

Example::

    from ckptstore.experiment.keys import config_error

    raise config_error("searcher.max_trials", "missing", "Set e.g. `max_trials: 8`.")
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ckptstore import errors

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Number = Annotated[float, Field(allow_inf_nan=False)]
_IGNORED = "Accepted and ignored here."
#: A key accepted for compatibility whose value changes nothing here.
Ignored = Annotated[Any, Field(default=None, description=_IGNORED)]
#: Tags of the config's unions: they appear in pydantic's error locations, never in a key path.
_TAG = re.compile(r"^(length|hp|storage|env):")


def ignored(names: str) -> dict[str, Any]:
    """Fields for Determined keys that change nothing here; a section's body declares them from
    its table with ``__annotations__.update(ignored("image pod_spec ..."))``."""
    return dict.fromkeys(names.split(), Ignored)


def did_you_mean(name: str, known: set[str] | tuple[str, ...]) -> str:
    """`` Did you mean `x`?`` for the closest of ``known``, or ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


class Section(BaseModel):
    """A mapping of the config: strict types (``"2"`` is not 2, ``yes`` is not true) and no
    unknown keys; an unknown key is named with the closest known one."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    #: Keys accepted for compatibility and reported in ``ExperimentConfig.ignored_keys``: the
    #: :data:`Ignored` fields but the ``quiet`` ones.
    ignored: ClassVar[frozenset[str]] = frozenset()
    quiet: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = cls.model_fields.items()
        cls.ignored = frozenset(k for k, f in fields if f.description == _IGNORED) - cls.quiet

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            for key in data:
                if key not in known:
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key. Remove it or fix the spelling.{hint}",
                        {"key": str(key), "hint": did_you_mean(str(key), known)},
                    )
        return data

    def _set(self, **values: Any) -> None:
        # Sections are frozen for their users; their own validators put the parsed values in.
        for name, value in values.items():
            object.__setattr__(self, name, value)


def config_error(
    key: str, problem: str, fix: str, error: type[errors.InvalidConfig] = errors.InvalidConfig
) -> errors.InvalidConfig:
    """The one wording of a config problem: the dotted key, what is wrong, the fix."""
    return error(f"Invalid experiment config at `{key}`: {problem}. {fix}")


def _key(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not _TAG.match(str(p))) or "<config>"


def as_invalid_config(exc: ValidationError, prefix: tuple[str, ...] = ()) -> errors.InvalidConfig:
    """The first problem of ``exc`` as users have always seen it: the key path, what is wrong,
    the value received and the fix (custom errors carry theirs in ``ctx["fix"]``, a choice its
    choices in ``ctx["expected"]``; a rule between keys raised its
    :class:`~ckptstore.errors.InvalidConfig` already worded)."""
    err = exc.errors(include_url=False)[0]
    kind, loc, ctx = err["type"], (*prefix, *err["loc"]), err.get("ctx") or {}
    if isinstance(ctx.get("error"), errors.InvalidConfig):
        return ctx["error"]
    received = err["input"]
    if kind == "unknown_key":
        fix = f"Remove it or fix the spelling.{ctx['hint']}"
        return config_error(_key((*loc, ctx["key"])), "unknown key", fix)
    if kind == "hp_type":
        loc, received = (*loc, "type"), received.get("type")
    if loc and loc[-1] == "[key]":  # a mapping key, not a value, is wrong
        loc = loc[:-1]
    key = _key(loc)
    if kind == "missing":
        return config_error(
            key, "missing", f"Add `{loc[-1]}` (see `ckptstore experiment schema` for its type)."
        )
    problem = err["msg"][0].lower() + err["msg"][1:]
    fix = ctx.get("fix") or "Fix the value (`ckptstore experiment schema` lists each key's type)."
    if kind in ("literal_error", "hp_type"):
        allowed = tuple(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        fix = f"Use one of {', '.join(allowed)}.{did_you_mean(str(received), allowed)}"
    elif kind == "string_pattern_mismatch":  # only hyperparameter names carry a pattern
        problem = "a hyperparameter name must not contain dots"
        fix = "Nest groups as mappings instead of dotted names."
    return config_error(key, f"{problem}, received {received!r}", fix)


def validate_as(adapter: TypeAdapter, value: Any, key: str) -> Any:
    """``value`` checked alone against one key's type; errors name ``key``."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise as_invalid_config(exc, tuple(key.split("."))) from None
