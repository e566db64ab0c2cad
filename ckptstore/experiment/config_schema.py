"""The experiment config's shape as pydantic v2 models: every key Determined 0.38 accepts, its
type, its bounds and its default, in one place that also publishes the JSON Schema.

:func:`validate` checks a raw config dict against the models and turns the first problem into
:class:`~ckptstore.errors.InvalidConfig` the way users have always seen it: the dotted key, what
was wrong, the value received and a fix, with "Did you mean" for a misspelt key. Rules between
keys (``single`` wants constant hyperparameters, a TFKerasTrial wants ``global_batch_size``, ...)
live in :mod:`ckptstore.experiment.config`, which turns a validated model into the
:class:`~ckptstore.experiment.config.ExperimentConfig` the runner uses.

Example::

    from ckptstore.experiment.config_schema import config_json_schema, validate

    model = validate({"entrypoint": "python3 train.py"})
    model.scheduling_unit                       # 100, Determined's default
    config_json_schema()["properties"]["searcher"]
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from ckptstore import errors

__all__ = [
    "HP_TYPES",
    "SEARCHERS",
    "config_json_schema",
    "validate",
    "validate_length",
]

#: Searcher names this runner implements (``tpe`` is a ckptstore extension).
SEARCHERS = ("single", "grid", "random", "adaptive_asha", "tpe")
#: Hyperparameter types.
HP_TYPES = ("const", "int", "double", "log", "categorical")
#: More trials than one machine's queue can hold are refused before anything is enqueued
#: (each trial is a row in the Optuna study, created up front).
MAX_TRIALS = 100_000

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Number = Annotated[float, Field(allow_inf_nan=False)]
#: A key accepted for compatibility whose value changes nothing here.
Ignored = Annotated[Any, Field(default=None, description="Accepted and ignored here.")]


def did_you_mean(name: str, known: set[str] | tuple[str, ...]) -> str:
    """`` Did you mean `x`?`` for the closest of ``known``, or ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


class _Section(BaseModel):
    """A mapping of the config: strict types (``"2"`` is not 2, ``yes`` is not true) and no
    unknown keys; an unknown key is named with the closest known one."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    #: Keys accepted for compatibility and reported in ``ExperimentConfig.ignored_keys``.
    ignored: ClassVar[frozenset[str]] = frozenset()

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


class LengthSpec(_Section):
    """``{batches: N}``, ``{records: N}`` or ``{epochs: N}``; 0 means "never" for periods."""

    batches: NonNegativeInt | None = None
    records: NonNegativeInt | None = None
    epochs: NonNegativeInt | None = None

    @model_validator(mode="after")
    def _one_unit(self) -> LengthSpec:
        if len(self.model_fields_set) != 1:
            raise PydanticCustomError(
                "one_unit",
                "expected exactly one of batches, records, epochs",
                {"fix": "Write it like `{batches: 100}`."},
            )
        return self


def _length_tag(value: Any) -> str:
    return (
        "length:steps" if isinstance(value, int) and not isinstance(value, bool) else "length:unit"
    )


#: A bare integer is Determined's older "steps" unit (``N * scheduling_unit`` batches).
Length = Annotated[
    Annotated[PositiveInt, Tag("length:steps")] | Annotated[LengthSpec, Tag("length:unit")],
    Discriminator(_length_tag),
]


# ---- hyperparameters ----------------------------------------------------------------------------
class ConstHP(_Section):
    """A hyperparameter with one value: ``{type: const, val: 0.9}``."""

    type: Literal["const"]
    val: Any


class CategoricalHP(_Section):
    """One of a list of values: ``{type: categorical, vals: [relu, tanh]}``."""

    type: Literal["categorical"]
    vals: Annotated[list[Any], Field(min_length=1)]


class _RangeHP(_Section):
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
        ),
    ],
)
#: Tags of the unions above: they appear in pydantic's error locations, never in a key path.
_TAG = re.compile(r"^(length|hp|storage|env):")


# ---- sections -----------------------------------------------------------------------------------
class Searcher(_Section):
    """The ``searcher`` section (cross-key rules are in :mod:`~ckptstore.experiment.config`)."""

    ignored: ClassVar[frozenset[str]] = frozenset(
        # 0.38 keys that change nothing here, then keys of searchers older releases removed.
        {"stop_once", "bracket_rungs"}
        | {"step_budget", "target_trial_steps", "train_stragglers", "budget"}
    )

    name: Literal[SEARCHERS]  # type: ignore[valid-type]
    metric: Annotated[str, Field(min_length=1, examples=["val_loss"])]
    smaller_is_better: bool = True
    max_length: Length | None = None
    max_steps: PositiveInt | None = None
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)] | None = None
    max_concurrent_trials: Annotated[
        NonNegativeInt,
        Field(
            description="Trials run at once on this machine (default 1; Determined's is 16). "
            "0, Determined's 'decide for me', is one per CPU."
        ),
    ] = 1
    divisor: Annotated[int, Field(ge=2)] = 4
    max_rungs: PositiveInt = 5
    mode: Literal["standard", "aggressive", "conservative"] = "standard"
    time_metric: Annotated[str, Field(min_length=1)] | None = None
    max_time: PositiveInt | None = None
    unit: Ignored
    stop_once: Ignored
    bracket_rungs: Ignored
    source_trial_id: Annotated[
        PositiveInt | None,
        Field(description="Warm start: every trial starts from this trial's latest checkpoint."),
    ] = None
    source_checkpoint_uuid: Annotated[
        str | None,
        Field(
            min_length=1,
            description="Warm start: every trial starts from this checkpoint (a ckptstore "
            "checkpoint, or a Determined checkpoint folder of that name in the storage).",
        ),
    ] = None
    step_budget: Ignored
    target_trial_steps: Ignored
    train_stragglers: Ignored
    budget: Ignored


class Resources(_Section):
    """``resources``: ``slots_per_trial`` / ``slots`` start workers here; the rest is the
    cluster's."""

    ignored: ClassVar[frozenset[str]] = frozenset(
        {"max_slots", "weight", "priority", "resource_pool", "shm_size", "devices"}
        | {"native_parallel", "is_single_node", "agent_label"}
    )

    slots_per_trial: PositiveInt = 1
    slots: PositiveInt = 1
    max_slots: Ignored
    weight: Ignored
    priority: Ignored
    resource_pool: Ignored
    shm_size: Ignored
    devices: Ignored
    native_parallel: Ignored
    is_single_node: Ignored
    agent_label: Ignored


_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def _env_assignment(value: str) -> str:
    if not _ENV_ASSIGNMENT.fullmatch(value):
        raise PydanticCustomError(
            "env_assignment",
            "expected NAME=value with NAME made of letters, digits and _",
            {"fix": "Write each variable like `- WANDB_MODE=offline`."},
        )
    return value


#: ``NAME=value`` (Determined's form of an environment variable; the value may be empty).
EnvAssignment = Annotated[
    str,
    AfterValidator(_env_assignment),
    Field(json_schema_extra={"pattern": _ENV_ASSIGNMENT.pattern}, examples=["WANDB_MODE=off"]),
]


class EnvironmentVariablesByAccelerator(_Section):
    """Determined's per-accelerator form of ``environment.environment_variables``; ckptstore's
    trials ask for CPU slots, so the ``cpu`` list applies."""

    cpu: list[EnvAssignment] | None = None
    cuda: list[EnvAssignment] | None = None
    rocm: list[EnvAssignment] | None = None


EnvironmentVariables = Annotated[
    Annotated[list[EnvAssignment], Tag("env:list")]
    | Annotated[EnvironmentVariablesByAccelerator, Tag("env:map")],
    Discriminator(lambda v: "env:map" if isinstance(v, dict) else "env:list"),
]


class Environment(_Section):
    """``environment``: ``environment_variables`` reach every trial process; the container keys
    are the cluster's."""

    ignored: ClassVar[frozenset[str]] = frozenset(
        {"image", "pod_spec", "registry_auth", "force_pull_image", "ports", "proxy_ports"}
        | {"add_capabilities", "drop_capabilities"}
    )

    environment_variables: EnvironmentVariables | None = None
    image: Ignored
    pod_spec: Ignored
    registry_auth: Ignored
    force_pull_image: Ignored
    ports: Ignored
    proxy_ports: Ignored
    add_capabilities: Ignored
    drop_capabilities: Ignored


class Reproducibility(_Section):
    """``reproducibility``: the seed trials derive theirs from."""

    experiment_seed: NonNegativeInt = 0


class StorageBlock(BaseModel):
    """A Determined ``checkpoint_storage`` mapping: the backend keys are checked when the
    storage is opened (:mod:`ckptstore.storage_backends.config`); the GC keys here."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    type: (
        Annotated[str, Field(examples=["s3", "gcs", "azure", "shared_fs", "directory"])] | None
    ) = None
    save_experiment_best: NonNegativeInt | None = None
    save_trial_best: NonNegativeInt | None = None
    save_trial_latest: NonNegativeInt | None = None


StorageSpec = Annotated[
    Annotated[str, Field(min_length=1, examples=["s3://bucket/prefix"]), Tag("storage:url")]
    | Annotated[StorageBlock, Tag("storage:block")],
    Discriminator(lambda v: "storage:url" if isinstance(v, str) else "storage:block"),
]


class Experiment(_Section):
    """A whole experiment config: Determined 0.38's keys (``ignored`` ones only mean something
    on a cluster). Where this differs from Determined's default it says so."""

    ignored: ClassVar[frozenset[str]] = frozenset(
        {"bind_mounts", "optimizations", "profiling", "workspace", "project"}
        | {"debug", "tensorboard_storage", "log_policies", "pbs", "slurm"}
        | {"retention_policy", "max_slots", "integrations", "internal", "security"}
    )
    #: Keys older Determined releases had and later removed: ignored, named in the warning.
    removed: ClassVar[frozenset[str]] = frozenset({"data_layer", "batches_per_step"})

    name: str | None = None
    description: str | None = None
    labels: list[str] | None = None
    hyperparameters: Annotated[dict[HPName, HPSpec], Field(json_schema_extra=_HP_NAMES)] | None = (
        None
    )
    searcher: Searcher | None = None
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    records_per_epoch: NonNegativeInt | None = None
    scheduling_unit: PositiveInt = 100
    checkpoint_storage: StorageSpec | None = None
    entrypoint: str | list[str] | None = None
    entrypoint_script: str | list[str] | None = None
    data: dict[str, Any] | None = None
    reproducibility: Reproducibility | None = None
    max_restarts: Annotated[
        NonNegativeInt, Field(description="Determined's default is 5; here 0 (fail fast).")
    ] = 0
    perform_initial_validation: bool = False
    resources: Resources | None = None
    environment: Environment | None = None
    bind_mounts: Ignored
    optimizations: Ignored
    profiling: Ignored
    workspace: Ignored
    project: Ignored
    checkpoint_policy: Annotated[
        Literal["best", "all", "none"],
        Field(
            description="TFKerasTrial: checkpoint after a validation that beats every earlier "
            "one in the experiment (best, Determined's default), after every validation (all) "
            "or only at min_checkpoint_period, the end and preemption (none)."
        ),
    ] = "best"
    debug: Ignored
    tensorboard_storage: Ignored
    log_policies: Ignored
    retention_policy: Ignored
    pbs: Ignored
    slurm: Ignored
    max_slots: Ignored
    integrations: Ignored
    internal: Ignored
    security: Ignored
    data_layer: Ignored
    batches_per_step: Ignored


def _key(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not _TAG.match(str(p))) or "<config>"


def _as_invalid_config(exc: ValidationError, prefix: tuple[str, ...] = ()) -> errors.InvalidConfig:
    """The first problem of ``exc`` as users have always seen it: the key path, what is wrong,
    the value received and the fix (custom errors carry theirs in ``ctx["fix"]``)."""
    err = exc.errors(include_url=False)[0]
    kind, loc, ctx = err["type"], (*prefix, *err["loc"]), err.get("ctx") or {}
    received = err["input"]
    if kind == "unknown_key":
        key = _key((*loc, ctx["key"]))
        return errors.InvalidConfig(f"Invalid experiment config at `{key}`: {err['msg']}")
    if kind == "hp_type":
        loc, received = (*loc, "type"), received.get("type")
    if loc and loc[-1] == "[key]":  # a mapping key, not a value, is wrong
        loc = loc[:-1]
    key = _key(loc)
    if kind == "missing":
        return errors.InvalidConfig(
            f"Invalid experiment config at `{key}`: missing. Add `{loc[-1]}` (see "
            "`ckptstore experiment schema` for its type)."
        )
    problem = err["msg"][0].lower() + err["msg"][1:]
    fix = ctx.get("fix") or "Fix the value (`ckptstore experiment schema` lists each key's type)."
    if kind == "literal_error":
        allowed = tuple(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        fix = f"Use one of {', '.join(allowed)}.{did_you_mean(str(received), allowed)}"
    elif kind == "string_pattern_mismatch":  # only hyperparameter names carry a pattern
        problem = "a hyperparameter name must not contain dots"
        fix = "Nest groups as mappings instead of dotted names."
    elif kind == "hp_type":
        fix = f"Use one of {', '.join(HP_TYPES)}.{did_you_mean(str(received), HP_TYPES)}"
    return errors.InvalidConfig(
        f"Invalid experiment config at `{key}`: {problem}, received {received!r}. {fix}"
    )


def validate(raw: Any) -> Experiment:
    """``raw`` checked against :class:`Experiment`; :class:`~ckptstore.errors.InvalidConfig`
    naming the first bad key otherwise."""
    if not isinstance(raw, dict):
        raise errors.InvalidConfig(
            f"An experiment config must be a YAML mapping, received {type(raw).__name__}. "
            "Start from examples/mnist_tfkeras_trial/const.yaml."
        )
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        raise _as_invalid_config(exc) from None


_LENGTH = TypeAdapter(Length)


def validate_length(value: Any, key: str) -> int | LengthSpec:
    """One length (``{batches: N}``, ... or a bare int of steps) checked alone; errors name
    ``key``."""
    try:
        return _LENGTH.validate_python(value)
    except ValidationError as exc:
        raise _as_invalid_config(exc, tuple(key.split("."))) from None


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an experiment config, as the docs publish it.

    Example::

        import json
        from ckptstore.experiment import config_json_schema

        print(json.dumps(config_json_schema(), indent=2))
    """
    schema = Experiment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ckptstore experiment config (Determined 0.38 keys)"
    return schema
