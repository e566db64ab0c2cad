"""Experiment configs: Determined's YAML keys, parsed and checked before anything runs.

:func:`load_config` reads a YAML file, :func:`parse_config` a dict. Both return an
:class:`ExperimentConfig` or raise :class:`~ckptstore.errors.InvalidConfig` whose message names the
key (``searcher.max_length``, ``hyperparameters.lr.maxval``, ...), the value received and the fix.
The keys, their types and defaults are the pydantic models of
:mod:`~ckptstore.experiment.config_schema` (which also publish the JSON Schema); this module holds
the rules between keys and turns a checked config into the objects the runner uses.

Lengths (``searcher.max_length``, ``min_validation_period``, ``min_checkpoint_period``) are
``{batches: N}``, ``{records: N}`` or ``{epochs: N}``. A bare integer is Determined's older "steps"
unit: ``N * scheduling_unit`` batches (``scheduling_unit`` defaults to 100), which is also what
``searcher.max_steps`` means. A period of 0 (Determined's default ``{batches: 0}``) is "off".

Determined 0.38 configs load unchanged (choices where 0.38 left it to the cluster):

- ``searcher.max_length`` is optional for ``single``/``grid``/``random``/``tpe`` when the
  entrypoint is a script (the script decides how long to train); a TFKerasTrial still needs it.
- ``adaptive_asha`` takes ``max_length`` or 0.38's ``time_metric`` + ``max_time`` (rungs are then
  counted in the validation metric ``time_metric``, e.g. ``batches`` or ``epochs``).
- No ``searcher`` at all (the "new Keras API" ``const.yaml``: ``hyperparameters`` +
  ``entrypoint_script``) means one trial with those hyperparameters, searcher metric
  ``val_loss`` (smaller is better), trained for the epochs the script passes.
- ``resources.slots_per_trial`` (experiments, scripts and TFKerasTrials) and ``resources.slots``
  (jobs) start that many workers (on this machine, or Ray Train workers); every other key that only means something on a Determined cluster
  (``environment``, ``bind_mounts``, ``profiling``, ``resources.resource_pool``, ...) and every
  key older releases removed (``data_layer``, ...) is accepted and listed in
  :attr:`ExperimentConfig.ignored_keys`, which the runner logs in one warning.
- A ``checkpoint_storage`` block holding only GC keys (``save_trial_best: 3``) keeps the default
  storage and sets those keys, as Determined merges it with the cluster's storage.

Configs are untrusted input: a YAML alias bomb, a list nested thousands deep, a grid or
``max_trials`` larger than a queue can hold, or an entrypoint a shell cannot split is refused
with :class:`~ckptstore.errors.InvalidConfig` in bounded time and memory.

This module never imports TensorFlow.

Example::

    from ckptstore.experiment.config import parse_config

    config = parse_config({
        "hyperparameters": {"global_batch_size": 32, "lr": {"type": "log", "minval": -4, "maxval": -1}},
        "searcher": {"name": "random", "metric": "val_loss", "max_length": {"batches": 50},
                     "max_trials": 4},
        "entrypoint": "model_def:MNISTTrial",
    })
    config.searcher.max_trials   # 4
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.retention import DETERMINED_DEFAULTS
from ckptstore.experiment import config_schema as schema
from ckptstore.experiment.config_schema import HP_TYPES, MAX_TRIALS, SEARCHERS
from ckptstore.validators import is_int

LENGTH_UNITS = ("batches", "records", "epochs")
#: Determined's default batches per "step".
DEFAULT_SCHEDULING_UNIT = 100
#: The searcher a config without ``searcher`` gets (the reference's ``entrypoint_script`` form).
DEFAULT_SEARCHER = {"name": "single", "metric": "val_loss", "smaller_is_better": True}
#: Bounds on the parsed YAML, checked before anything walks it recursively: deeper nesting
#: overflows Python's stack, and aliases can make a 1 kB file expand to billions of nodes.
MAX_DEPTH = 64
MAX_NODES = 200_000
_ENTRYPOINT_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: Determined's legacy launcher form of a trial class:
#: ``python3 -m determined.launch.horovod --autohorovod --trial model_def:Trial``.
_LAUNCHED_CLASS = re.compile(
    r"^(?:python3?\s+)?-m\s+determined\.launch\.\w+(?:\s+--[\w-]+)*?\s+--trial\s+"
    r"(?P<cls>[A-Za-z_][\w.]*:[A-Za-z_][\w.]*)$"
)


def _fail(
    key: str,
    problem: str,
    fix: str,
    error: type[errors.InvalidConfig] = errors.InvalidConfig,
) -> errors.InvalidConfig:
    return error(f"Invalid experiment config at `{key}`: {problem}. {fix}")


# ---- lengths ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Length:
    """A training length in one unit: ``Length("batches", 100)``."""

    unit: str
    value: int

    def to_batches(self, global_batch_size: int, records_per_epoch: int | None) -> int:
        """The length in batches (records and epochs round up to whole batches)."""
        if self.unit == "batches":
            return self.value
        if self.unit == "records":
            return max(1, math.ceil(self.value / global_batch_size))
        if not records_per_epoch:
            raise errors.InvalidConfig(
                f"A length of {{epochs: {self.value}}} needs the number of records per epoch. "
                "Set `records_per_epoch` in the experiment config, or use a training data loader "
                "whose length is known (NumPy arrays or a Sequence)."
            )
        return max(1, math.ceil(self.value * records_per_epoch / global_batch_size))

    def to_dict(self) -> dict[str, int]:
        return {self.unit: self.value}


def _length(
    spec: int | schema.LengthSpec | None, key: str, scheduling_unit: int, *, zero_is_off: bool
) -> Length | None:
    """A checked length as a :class:`Length`; None when absent or (for periods) 0."""
    if spec is None:
        return None
    if isinstance(spec, int):  # Determined's older unit: steps of scheduling_unit batches
        return Length("batches", spec * scheduling_unit)
    ((unit, amount),) = spec.model_dump(exclude_unset=True).items()
    if amount == 0:
        if zero_is_off:
            return None
        raise _fail(f"{key}.{unit}", "expected a positive integer, received 0", "Set e.g. 100.")
    return Length(unit, amount)


def parse_length(value: Any, key: str, scheduling_unit: int) -> Length:
    """``{batches|records|epochs: N}`` or a bare int of steps (``N * scheduling_unit`` batches)."""
    length = _length(schema.validate_length(value, key), key, scheduling_unit, zero_is_off=False)
    assert length is not None
    return length


# ---- hyperparameters ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: its dotted ``name`` (nested groups joined by ``.``) and its spec."""

    name: str
    type: str
    val: Any = None
    minval: float | None = None
    maxval: float | None = None
    base: float = 10.0
    count: int | None = None
    vals: tuple[Any, ...] = ()

    def grid_size(self) -> int:
        """How many values a grid search tries, computed without listing them."""
        if self.type == "const":
            return 1
        if self.type == "categorical":
            return len(self.vals)
        assert self.count is not None and self.minval is not None and self.maxval is not None
        if self.type == "int":
            return min(self.count, int(self.maxval) - int(self.minval) + 1)
        return self.count

    def grid_values(self) -> list[Any]:
        """The values a grid search tries (``count`` evenly spaced points for ranges)."""
        if self.type == "const":
            return [self.val]
        if self.type == "categorical":
            return list(self.vals)
        assert self.count is not None and self.minval is not None and self.maxval is not None
        if self.type == "int" and self.count > self.maxval - self.minval + 1:
            # Points closer than 1 apart round to every integer of the range: list those.
            return list(range(int(self.minval), int(self.maxval) + 1))
        if self.count == 1:
            points = [(self.minval + self.maxval) / 2]
        else:
            step = (self.maxval - self.minval) / (self.count - 1)
            points = [self.minval + i * step for i in range(self.count)]
        if self.type == "int":
            return sorted({int(round(p)) for p in points})
        if self.type == "log":
            return [float(self.base**p) for p in points]
        return [float(p) for p in points]


def _flatten(name: str, spec: Any, out: list[Hyperparameter]) -> None:
    if isinstance(spec, dict):  # a nested group of hyperparameters
        for sub, sub_spec in spec.items():
            _flatten(f"{name}.{sub}", sub_spec, out)
    elif isinstance(spec, schema.ConstHP):
        out.append(Hyperparameter(name, "const", val=spec.val))
    elif isinstance(spec, schema.CategoricalHP):
        out.append(Hyperparameter(name, "categorical", vals=tuple(spec.vals)))
    elif isinstance(spec, schema.IntHP | schema.DoubleHP | schema.LogHP):
        base = float(spec.base) if isinstance(spec, schema.LogHP) else 10.0
        out.append(
            Hyperparameter(
                name, spec.type, minval=spec.minval, maxval=spec.maxval, base=base, count=spec.count
            )
        )
    else:
        out.append(Hyperparameter(name, "const", val=spec))


def _hyperparameters(checked: dict[str, Any] | None) -> list[Hyperparameter]:
    out: list[Hyperparameter] = []
    for name, spec in (checked or {}).items():
        _flatten(name, spec, out)
    return out


def parse_hyperparameters(raw: Any) -> list[Hyperparameter]:
    """Flatten the ``hyperparameters`` section into :class:`Hyperparameter` objects."""
    if raw is not None and not isinstance(raw, dict):
        raise _fail(
            "hyperparameters",
            f"expected a mapping of names to values or specs, received {type(raw).__name__}",
            "Write it like `hyperparameters: {global_batch_size: 32}`.",
        )
    check_size(raw, "hyperparameters")
    return _hyperparameters(schema.validate({"hyperparameters": raw}).hyperparameters)


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


# ---- searcher -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SearcherConfig:
    """The ``searcher`` section."""

    name: str
    metric: str
    smaller_is_better: bool
    max_length: Length | None
    max_trials: int
    max_concurrent_trials: int
    divisor: int = 4
    max_rungs: int = 5
    mode: str = "standard"
    #: 0.38's ASHA form: rungs counted in this validation metric (``batches``, ``epochs``, ...).
    time_metric: str | None = None
    max_time: int | None = None
    #: Determined's warm start: trials without a checkpoint of their own start from this
    #: checkpoint's weights (``source_checkpoint_uuid``) or from this trial's latest checkpoint.
    source_checkpoint_uuid: str | None = None
    source_trial_id: int | None = None

    def search_length(self) -> tuple[str, int] | None:
        """``(unit, amount)`` a trial trains for: ``max_length`` or ``(time_metric, max_time)``;
        None when the script decides (no ``max_length``)."""
        if self.max_length is not None:
            return self.max_length.unit, self.max_length.value
        if self.time_metric is not None and self.max_time is not None:
            return self.time_metric, self.max_time
        return None

    def rung_lengths(self) -> list[int]:
        """Where an ``adaptive_asha`` trial validates and may be stopped, in the unit of
        :meth:`search_length` (Determined's rule: ``min(max_rungs, floor(log_divisor(
        max_trials)) + 1)`` rungs, rung ``k`` at ``max // divisor**(rungs - 1 - k)``, at least
        1); ``[max]`` for other searchers; ``[]`` without a length."""
        length = self.search_length()
        if length is None:
            return []
        total = length[1]
        if self.name != "adaptive_asha":
            return [total]
        rungs = min(self.max_rungs, int(math.log(self.max_trials) / math.log(self.divisor)) + 1)
        points = [max(1, total // self.divisor ** (rungs - 1 - k)) for k in range(rungs)]
        return sorted(set(points))


def _time_metric(raw: schema.Searcher) -> tuple[str | None, int | None]:
    """0.38's ``time_metric`` + ``max_time`` (both or neither; ``adaptive_asha`` only)."""
    if raw.time_metric is None and raw.max_time is None:
        return None, None
    if raw.name != "adaptive_asha":
        raise _fail(
            "searcher.time_metric",
            f"`time_metric`/`max_time` apply to `adaptive_asha`, not `{raw.name}`",
            "Remove them, or use `name: adaptive_asha`.",
        )
    if raw.time_metric is None:
        raise _fail(
            "searcher.time_metric",
            "expected the name of a validation metric, received None",
            "Set e.g. `time_metric: batches` together with `max_time: 1000`.",
        )
    if raw.max_time is None:
        raise _fail("searcher.max_time", "missing", "Set e.g. `max_time: 1000`.")
    if raw.max_length is not None or raw.max_steps is not None:
        raise _fail(
            "searcher.max_length",
            "give `max_length` or `time_metric` + `max_time`, not both",
            "Keep one form.",
        )
    return raw.time_metric, raw.max_time


def _max_length(raw: schema.Searcher, unit: int, *, script: bool) -> Length | None:
    if raw.max_length is not None and raw.max_steps is not None:
        raise _fail(
            "searcher.max_length",
            "give only one of `max_length` and `max_steps`",
            "Set e.g. `max_length: {batches: 1000}`.",
        )
    if raw.max_length is not None:
        return _length(raw.max_length, "searcher.max_length", unit, zero_is_off=False)
    if raw.max_steps is not None:
        return Length("batches", raw.max_steps * unit)
    if raw.time_metric is None and (not script or raw.name == "adaptive_asha"):
        why = (
            "`adaptive_asha` needs `max_length` or `time_metric` + `max_time`"
            if raw.name == "adaptive_asha"
            else "a TFKerasTrial entrypoint needs `max_length` to know how long to train"
        )
        raise _fail(
            "searcher.max_length", f"missing: {why}", "Set e.g. `max_length: {batches: 1000}`."
        )
    return None


def _max_trials(raw: schema.Searcher, hparams: list[Hyperparameter]) -> int:
    if raw.name == "single":
        for hp in hparams:
            if hp.type != "const":
                raise _fail(
                    f"hyperparameters.{hp.name}",
                    f"the `single` searcher needs constant hyperparameters, got type {hp.type!r}",
                    "Use `searcher.name: random` (or grid) to search, or give a constant value.",
                )
        return 1
    if raw.name == "grid":
        for hp in hparams:
            if hp.type in ("int", "double", "log") and hp.count is None:
                raise _fail(
                    f"hyperparameters.{hp.name}.count",
                    "the grid searcher needs `count` for int, double and log hyperparameters",
                    "Add e.g. `count: 3`.",
                )
        # The product of the sizes, never the grid itself: counts of 10**9 list nothing.
        size = math.prod(hp.grid_size() for hp in hparams)
        if size > MAX_TRIALS:
            raise _fail(
                "hyperparameters",
                f"the grid has {size} points, more than the {MAX_TRIALS} trials an experiment "
                f"may have, received counts {[hp.grid_size() for hp in hparams]}",
                "Lower the `count`s or search with `random`/`tpe` and `max_trials`.",
            )
        return size
    if raw.max_trials is None:
        raise _fail(
            "searcher.max_trials",
            "missing",
            f"The `{raw.name}` searcher needs e.g. `max_trials: 8`.",
        )
    return raw.max_trials


def _searcher(
    raw: schema.Searcher, hparams: list[Hyperparameter], unit: int, *, script: bool
) -> SearcherConfig:
    time_metric, max_time = _time_metric(raw)
    if raw.source_checkpoint_uuid is not None and raw.source_trial_id is not None:
        raise _fail(
            "searcher.source_trial_id",
            f"both it ({raw.source_trial_id}) and `source_checkpoint_uuid` "
            f"({raw.source_checkpoint_uuid!r}) name the checkpoint trials start from",
            "Keep one of them.",
        )
    return SearcherConfig(
        name=raw.name,
        metric=raw.metric,
        smaller_is_better=raw.smaller_is_better,
        max_length=_max_length(raw, unit, script=script),
        max_trials=_max_trials(raw, hparams),
        max_concurrent_trials=raw.max_concurrent_trials or max(1, os.cpu_count() or 1),
        divisor=raw.divisor,
        max_rungs=raw.max_rungs,
        mode=raw.mode,
        time_metric=time_metric,
        max_time=max_time,
        source_checkpoint_uuid=raw.source_checkpoint_uuid,
        source_trial_id=raw.source_trial_id,
    )


# ---- the whole config ---------------------------------------------------------------------------
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


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A checked experiment config. ``raw`` keeps the dict as given (stored in the registry)."""

    raw: dict[str, Any]
    description: str
    hyperparameters: list[Hyperparameter]
    searcher: SearcherConfig
    entrypoint: Entrypoint
    scheduling_unit: int = DEFAULT_SCHEDULING_UNIT
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    records_per_epoch: int | None = None
    #: The storage block or URL; None for the default storage (also when the block holds only
    #: GC keys, which are then in :attr:`retention`).
    checkpoint_storage: str | dict[str, Any] | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    experiment_seed: int = 0
    max_restarts: int = 0
    perform_initial_validation: bool = False
    #: ``best`` (Determined's default), ``all`` or ``none``: checkpoints a TFKerasTrial takes
    #: after validations (:class:`~ckptstore.keras_io.trial.controller.TrialController`).
    checkpoint_policy: str = "best"
    ignored_keys: tuple[str, ...] = ()
    #: ``resources.slots_per_trial``: workers started per trial on this machine.
    slots_per_trial: int = 1
    #: ``resources.slots``: workers of a job (``ckptstore job run``).
    slots: int = 1
    #: The GC keys given in ``checkpoint_storage`` (Determined's names).
    retention: dict[str, int] = dataclasses.field(default_factory=dict)
    #: ``environment.environment_variables`` as NAME -> value (the ``cpu`` list of the
    #: per-accelerator form): set in every trial process, under ckptstore's own keys.
    environment_variables: dict[str, str] = dataclasses.field(default_factory=dict)

    def constant_hparams(self) -> dict[str, Any]:
        """Nested hyperparameters when every one is constant (the ``single`` searcher)."""
        return nest_hparams({hp.name: hp.val for hp in self.hyperparameters})

    def gc_settings(self) -> dict[str, int]:
        """Determined's GC keys from ``checkpoint_storage`` (defaults filled in)."""
        return {**DETERMINED_DEFAULTS, **self.retention}


def _storage(block: str | schema.StorageBlock | None) -> tuple[str | dict[str, Any] | None, dict]:
    """``(storage, GC keys)``: a block of GC keys alone keeps the default storage."""
    if block is None:
        return None, {}
    if isinstance(block, str):
        if not block.strip():
            raise _fail(
                "checkpoint_storage",
                f"expected a URL or a storage mapping, received {block!r}",
                "Use e.g. `checkpoint_storage: s3://bucket/prefix` or `{type: s3, bucket: b}`.",
            )
        return block.strip(), {}
    given = block.model_dump(exclude_unset=True)
    retention = {k: given[k] for k in DETERMINED_DEFAULTS if given.get(k) is not None}
    if block.type is not None:
        return given, retention
    if set(given) <= set(DETERMINED_DEFAULTS):  # Determined merges it with the cluster's storage
        return None, retention
    raise _fail(
        "checkpoint_storage.type",
        f"missing, received keys {sorted(given)}",
        "Add `type: s3` (or gcs, azure, shared_fs, directory).",
    )


def _entrypoint(model: schema.Experiment) -> Entrypoint:
    value = model.entrypoint if model.entrypoint is not None else model.entrypoint_script
    if isinstance(value, list) and value:
        value = shlex.join(value)
    if not isinstance(value, str) or not value.strip():
        raise _fail(
            "entrypoint",
            f"missing or empty (received {value!r})",
            "Set `entrypoint: model_def:MNISTTrial` or `entrypoint: python3 train.py`.",
        )
    value = value.strip()
    launched = _LAUNCHED_CLASS.match(" ".join(value.split()))
    if launched or _ENTRYPOINT_CLASS.match(value):
        module, attr = (launched.group("cls") if launched else value).split(":", 1)
        return Entrypoint(value, module, attr)
    try:  # the runner splits it for every trial: refuse now what it could not split then
        shlex.split(value)
    except ValueError as exc:
        raise _fail(
            "entrypoint",
            f"a shell cannot split this command ({exc}), received {value!r}",
            "Balance the quotes, e.g. `entrypoint: python3 train.py`.",
        ) from None
    return Entrypoint(value)


def _check_batch_size(hparams: list[Hyperparameter]) -> None:
    """A TFKerasTrial batches its data with ``global_batch_size``: it must be a positive int."""
    gbs = next((hp for hp in hparams if hp.name == "global_batch_size"), None)
    if gbs is None:
        raise _fail(
            "hyperparameters.global_batch_size",
            # "is a required hyperparameter": Determined's wording, which its tests match
            "missing: global_batch_size is a required hyperparameter; a TFKerasTrial needs it "
            "to batch data and count records",
            "Add e.g. `global_batch_size: 32` under `hyperparameters`.",
            errors.InvalidExperimentException,  # Determined's error for this case
        )
    values = gbs.grid_values() if gbs.type in ("const", "categorical") else [gbs.minval]
    if gbs.type in ("double", "log") or not all(is_int(v) and v > 0 for v in values):
        raise _fail(
            "hyperparameters.global_batch_size",
            f"must be a positive integer, received {values!r}",
            "Set e.g. `global_batch_size: 32`.",
            errors.InvalidExperimentException,
        )


def _ignored(raw: dict[str, Any], model: schema.Experiment) -> list[str]:
    """The keys accepted for compatibility that change nothing here, in one list to warn about."""
    ignored = [k for k in raw if k in schema.Experiment.ignored]
    ignored += [f"{k} (removed from Determined)" for k in raw if k in schema.Experiment.removed]
    sections = (
        (model.searcher, "searcher"),
        (model.resources, "resources"),
        (model.environment, "environment"),
    )
    for section, key in sections:
        if section is not None:
            given = section.model_fields_set & type(section).ignored
            ignored += [f"{key}.{k}" for k in raw[key] if k in given]
    return ignored


def _environment_variables(environment: schema.Environment | None) -> dict[str, str]:
    """``NAME=value`` entries as a dict (a later entry wins, as in a shell); Determined's
    per-accelerator mapping gives its ``cpu`` list (ckptstore's trials ask for CPUs)."""
    from ckptstore.experiment.common import runner_set_env

    given = environment.environment_variables if environment is not None else None
    if isinstance(given, schema.EnvironmentVariablesByAccelerator):
        given = given.cpu
    variables = dict(entry.split("=", 1) for entry in given or ())
    taken = sorted(set(variables) & runner_set_env())
    if taken:  # the runner's value would win: refuse rather than ignore the user's silently
        raise _fail(
            "environment.environment_variables",
            f"{', '.join(taken)} is set by ckptstore for every trial, received {taken}",
            "Give storage and registry with --storage/--registry (or checkpoint_storage), "
            "and the data config under `data:`.",
        )
    return variables


def check_size(raw: Any, where: str = "<config>") -> None:
    """Refuse a config nested deeper than :data:`MAX_DEPTH` or with more than
    :data:`MAX_NODES` values, counting a YAML alias each time it is used (an alias bomb
    stops here after ``MAX_NODES`` steps instead of exhausting memory later)."""
    level, depth, nodes = [raw], 0, 1
    while level:  # breadth first, one list per level: no recursion, few allocations
        below: list[Any] = []
        for node in level:
            if isinstance(node, dict):
                below.extend(node.values())
            elif isinstance(node, list | tuple):
                below.extend(node)
            if nodes + len(below) > MAX_NODES or (below and depth + 1 > MAX_DEPTH):
                what = f"nested deeper than {MAX_DEPTH}" if depth + 1 > MAX_DEPTH else "too large"
                raise _fail(
                    where,
                    f"the config is {what} (at most {MAX_DEPTH} levels and {MAX_NODES} values, "
                    f"YAML aliases counted each time they are used), received more than "
                    f"{nodes + len(below)} values down to depth {depth + 1}",
                    "Flatten it or move bulky data into a file the trial reads.",
                )
        level, depth, nodes = below, depth + 1, nodes + len(below)


def parse_config(raw: Any) -> ExperimentConfig:
    """Check a config dict and return an :class:`ExperimentConfig`.

    Raises :class:`~ckptstore.errors.InvalidConfig` naming the first bad key and how to fix it.
    """
    check_size(raw)
    model = schema.validate(raw)
    unit = model.scheduling_unit
    hparams = _hyperparameters(model.hyperparameters)
    entrypoint = _entrypoint(model)
    searcher_raw = model.searcher
    if searcher_raw is None and entrypoint.is_trial_class:
        raise _fail(
            "searcher",
            "missing",
            "Add e.g. `searcher: {name: single, metric: val_loss, max_length: {batches: 100}}`.",
        )
    searcher = _searcher(
        searcher_raw or schema.Searcher(**DEFAULT_SEARCHER),
        hparams,
        unit,
        script=not entrypoint.is_trial_class,
    )
    ignored = _ignored(raw, model)
    if "checkpoint_policy" in raw and not entrypoint.is_trial_class:
        # Determined applies it in its Trial harness only; a script decides its own saves.
        ignored.append("checkpoint_policy (a script checkpoints when it calls upload/save)")
    for key in ("source_checkpoint_uuid", "source_trial_id"):
        if getattr(searcher, key) is not None and not entrypoint.is_trial_class:
            # the TFKerasTrial controller warm-starts; a script's info.latest_checkpoint does not
            ignored.append(f"searcher.{key} (a script loads the checkpoint it wants itself)")
    resources = model.resources or schema.Resources()
    if entrypoint.is_trial_class:
        searcher = _trial_class_length(searcher)
        _check_batch_size(hparams)
    storage, retention = _storage(model.checkpoint_storage)
    return ExperimentConfig(
        raw=raw,
        description=model.description if model.description is not None else model.name or "",
        hyperparameters=hparams,
        searcher=searcher,
        entrypoint=entrypoint,
        scheduling_unit=unit,
        min_validation_period=_length(
            model.min_validation_period, "min_validation_period", unit, zero_is_off=True
        ),
        min_checkpoint_period=_length(
            model.min_checkpoint_period, "min_checkpoint_period", unit, zero_is_off=True
        ),
        records_per_epoch=model.records_per_epoch or None,  # Determined's default 0 is "unset"
        checkpoint_storage=storage,
        data=dict(model.data or {}),
        experiment_seed=(model.reproducibility or schema.Reproducibility()).experiment_seed,
        max_restarts=model.max_restarts,
        perform_initial_validation=model.perform_initial_validation,
        checkpoint_policy=model.checkpoint_policy,
        ignored_keys=tuple(ignored),
        slots_per_trial=resources.slots_per_trial,
        slots=resources.slots,
        retention=retention,
        environment_variables=_environment_variables(model.environment),
    )


def _trial_class_length(searcher: SearcherConfig) -> SearcherConfig:
    """A TFKerasTrial counts its own time: 0.38's ``time_metric`` must be one of its units."""
    if searcher.max_length is not None:
        return searcher
    if searcher.time_metric not in LENGTH_UNITS:
        raise _fail(
            "searcher.time_metric",
            f"a TFKerasTrial counts batches, records or epochs, not {searcher.time_metric!r}",
            "Use `time_metric: batches` (or records, epochs), or `max_length`.",
        )
    assert searcher.max_time is not None
    return dataclasses.replace(searcher, max_length=Length(searcher.time_metric, searcher.max_time))


#: A config file larger than this is not a config (Determined's are a few kB).
MAX_BYTES = 1 << 20


def _yaml_depth_ok(text: str) -> bool:
    """True when no collection in ``text`` nests deeper than :data:`MAX_DEPTH`, read from
    the YAML event stream (iterative), before PyYAML's recursive composer could overflow the
    stack. libyaml's parser when installed: the pure-Python scanner is quadratic in nesting."""
    import yaml

    depth = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return False
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit (1000 levels)
            return False
        raise
    return True


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and check a YAML experiment config file.

    Raises :class:`~ckptstore.errors.InvalidConfig` when the file is missing, is not YAML, or
    holds a bad config.
    """
    import yaml

    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise errors.InvalidConfig(
            f"Cannot read the experiment config {str(path)!r}: {exc.strerror}. "
            "Pass the path of a YAML file such as examples/mnist_tfkeras_trial/const.yaml."
        ) from None
    if len(data) > MAX_BYTES:
        raise errors.InvalidConfig(
            f"The experiment config {str(path)!r} is larger than {MAX_BYTES} bytes; an "
            "experiment config is a few kB. Move bulky data into a file the trial reads."
        )
    try:
        text = data.decode("utf-8")
        if not _yaml_depth_ok(text):
            raise _fail(
                "<config>",
                f"collections are nested deeper than {MAX_DEPTH} levels, received {str(path)!r}",
                "Flatten it.",
            )
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise errors.InvalidConfig(
            f"The experiment config {str(path)!r} is not valid YAML: {exc}. Fix the syntax."
        ) from None
    return parse_config(raw)


__all__ = [
    "ExperimentConfig",
    "Entrypoint",
    "HP_TYPES",
    "Hyperparameter",
    "Length",
    "SEARCHERS",
    "SearcherConfig",
    "check_size",
    "load_config",
    "nest_hparams",
    "parse_config",
    "parse_hyperparameters",
    "parse_length",
]
