"""Experiment configs: Determined's YAML keys, parsed and checked before anything runs.

:func:`load_config` reads a YAML file, :func:`parse_config` a dict. Both return an
:class:`ExperimentConfig` or raise :class:`~ckptstore.errors.InvalidConfig` whose message names the
key (``searcher.max_length``, ``hyperparameters.lr.maxval``, ...), the value received and the fix.

Lengths (``searcher.max_length``, ``min_validation_period``, ``min_checkpoint_period``) are
``{batches: N}``, ``{records: N}`` or ``{epochs: N}``. A bare integer is Determined's older "steps"
unit: ``N * scheduling_unit`` batches (``scheduling_unit`` defaults to 100), which is also what
``searcher.max_steps`` means.

Determined 0.38 configs load unchanged (choices where 0.38 left it to the cluster):

- ``searcher.max_length`` is optional for ``single``/``grid``/``random``/``tpe`` when the
  entrypoint is a script (the script decides how long to train); a TFKerasTrial still needs it.
- ``adaptive_asha`` takes ``max_length`` or 0.38's ``time_metric`` + ``max_time`` (rungs are then
  counted in the validation metric ``time_metric``, e.g. ``batches`` or ``epochs``).
- No ``searcher`` at all (the "new Keras API" ``const.yaml``: ``hyperparameters`` +
  ``entrypoint_script``) means one trial with those hyperparameters, searcher metric
  ``val_loss`` (smaller is better), trained for the epochs the script passes.
- ``resources.slots_per_trial`` (experiments) and ``resources.slots`` (jobs) start that many
  workers on this machine; every other key that only means something on a Determined cluster
  (``environment``, ``bind_mounts``, ``profiling``, ``resources.resource_pool``, ...) is accepted
  and listed in :attr:`ExperimentConfig.ignored_keys`, which the runner logs in one warning.

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
import difflib
import math
import re
from pathlib import Path
from typing import Any

from ckptstore import errors
from ckptstore.validators import is_int, is_number

#: Searcher names this runner implements (``tpe`` is a ckptstore extension).
SEARCHERS = ("single", "grid", "random", "adaptive_asha", "tpe")
#: Hyperparameter types.
HP_TYPES = ("const", "int", "double", "log", "categorical")
LENGTH_UNITS = ("batches", "records", "epochs")
#: Determined's default batches per "step".
DEFAULT_SCHEDULING_UNIT = 100
#: Keys of the storage dict that configure checkpoint GC (Determined's names and defaults).
GC_KEYS = {"save_experiment_best": 0, "save_trial_best": 1, "save_trial_latest": 1}

_KNOWN_TOP = {
    "name",
    "description",
    "hyperparameters",
    "searcher",
    "min_validation_period",
    "min_checkpoint_period",
    "records_per_epoch",
    "scheduling_unit",
    "checkpoint_storage",
    "entrypoint",
    "entrypoint_script",
    "data",
    "reproducibility",
    "max_restarts",
    "perform_initial_validation",
    "labels",
    "resources",
}
#: Determined keys that only make sense on a cluster: accepted and ignored (with a note).
_IGNORED_TOP = {
    "environment",
    "bind_mounts",
    "optimizations",
    "profiling",
    "workspace",
    "project",
    "checkpoint_policy",
    "debug",
    "tensorboard_storage",
    "log_policies",
    "retention_policy",
    "pbs",
    "slurm",
    "max_slots",
    "integrations",
}
_SEARCHER_KEYS = {
    "name",
    "metric",
    "smaller_is_better",
    "max_length",
    "max_steps",
    "max_trials",
    "max_concurrent_trials",
    "divisor",
    "max_rungs",
    "mode",
    "stop_once",
    "bracket_rungs",
    "source_trial_id",
    "source_checkpoint_uuid",
    "time_metric",
    "max_time",
    "unit",
}
#: Searcher keys accepted for compatibility that change nothing here.
_IGNORED_SEARCHER = {"stop_once", "bracket_rungs", "source_trial_id", "source_checkpoint_uuid"}
#: ``resources`` keys with a meaning here; the rest of Determined's are accepted and ignored.
_RESOURCE_KEYS = {"slots_per_trial", "slots"}
_IGNORED_RESOURCES = {
    "max_slots",
    "weight",
    "priority",
    "resource_pool",
    "shm_size",
    "devices",
    "native_parallel",
    "is_single_node",
}
#: The searcher a config without ``searcher`` gets (the reference's ``entrypoint_script`` form).
DEFAULT_SEARCHER = {"name": "single", "metric": "val_loss", "smaller_is_better": True}
_ENTRYPOINT_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: Determined's legacy launcher form of a trial class:
#: ``python3 -m determined.launch.horovod --autohorovod --trial model_def:Trial``.
_LAUNCHED_CLASS = re.compile(
    r"^(?:python3?\s+)?-m\s+determined\.launch\.\w+(?:\s+--[\w-]+)*?\s+--trial\s+"
    r"(?P<cls>[A-Za-z_][\w.]*:[A-Za-z_][\w.]*)$"
)


def _fail(key: str, problem: str, fix: str) -> errors.InvalidConfig:
    return errors.InvalidConfig(f"Invalid experiment config at `{key}`: {problem}. {fix}")


def _suggest(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


_is_int = is_int
_is_number = is_number


def _positive_int(value: Any, key: str, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not _is_int(value) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise _fail(key, f"expected {kind} integer, received {value!r}", f"Set `{key}` to e.g. 10.")
    return int(value)


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


def parse_length(value: Any, key: str, scheduling_unit: int) -> Length:
    """``{batches|records|epochs: N}`` or a bare int of steps (``N * scheduling_unit`` batches)."""
    if _is_int(value):
        return Length("batches", _positive_int(value, key) * scheduling_unit)
    if not isinstance(value, dict) or len(value) != 1:
        raise _fail(
            key,
            f"expected a dict with exactly one of {', '.join(LENGTH_UNITS)}, received {value!r}",
            f"Write it like `{key}: {{batches: 100}}`.",
        )
    ((unit, amount),) = value.items()
    if unit not in LENGTH_UNITS:
        raise _fail(
            f"{key}.{unit}",
            f"unknown unit {unit!r}",
            f"Use one of {', '.join(LENGTH_UNITS)}.{_suggest(str(unit), set(LENGTH_UNITS))}",
        )
    return Length(unit, _positive_int(amount, f"{key}.{unit}"))


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

    def grid_values(self) -> list[Any]:
        """The values a grid search tries (``count`` evenly spaced points for ranges)."""
        if self.type == "const":
            return [self.val]
        if self.type == "categorical":
            return list(self.vals)
        assert self.count is not None and self.minval is not None and self.maxval is not None
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


def _parse_hparam(name: str, spec: Any, out: list[Hyperparameter]) -> None:
    key = f"hyperparameters.{name}"
    if not isinstance(spec, dict):
        out.append(Hyperparameter(name, "const", val=spec))
        return
    if "type" not in spec:  # a nested group of hyperparameters
        if not spec:
            raise _fail(key, "an empty group", "Give it hyperparameters or remove it.")
        for sub, sub_spec in spec.items():
            _parse_hparam(f"{name}.{sub}", sub_spec, out)
        return
    kind = spec["type"]
    if kind not in HP_TYPES:
        raise _fail(
            f"{key}.type",
            f"unknown hyperparameter type {kind!r}",
            f"Use one of {', '.join(HP_TYPES)}.{_suggest(str(kind), set(HP_TYPES))}",
        )
    allowed = {
        "const": {"type", "val"},
        "categorical": {"type", "vals"},
        "int": {"type", "minval", "maxval", "count"},
        "double": {"type", "minval", "maxval", "count"},
        "log": {"type", "minval", "maxval", "count", "base"},
    }[kind]
    for extra in spec:
        if extra not in allowed:
            raise _fail(
                f"{key}.{extra}",
                f"not a key of a `{kind}` hyperparameter",
                f"Allowed keys: {', '.join(sorted(allowed))}.{_suggest(str(extra), allowed)}",
            )
    if kind == "const":
        if "val" not in spec:
            raise _fail(f"{key}.val", "missing", "A const hyperparameter needs `val: VALUE`.")
        out.append(Hyperparameter(name, "const", val=spec["val"]))
        return
    if kind == "categorical":
        vals = spec.get("vals")
        if not isinstance(vals, list) or not vals:
            raise _fail(
                f"{key}.vals",
                f"expected a non-empty list, received {vals!r}",
                "Set `vals: [a, b]`.",
            )
        out.append(Hyperparameter(name, "categorical", vals=tuple(vals)))
        return
    check = _is_int if kind == "int" else _is_number
    bounds = {}
    for bound in ("minval", "maxval"):
        if bound not in spec:
            raise _fail(f"{key}.{bound}", "missing", f"A `{kind}` hyperparameter needs `{bound}`.")
        if not check(spec[bound]):
            want = "an integer" if kind == "int" else "a number"
            raise _fail(
                f"{key}.{bound}",
                f"expected {want}, received {spec[bound]!r}",
                f"Set `{bound}` to {want}.",
            )
        bounds[bound] = spec[bound]
    if bounds["minval"] > bounds["maxval"]:
        raise _fail(
            key,
            f"minval {bounds['minval']!r} is greater than maxval {bounds['maxval']!r}",
            "Swap them so minval <= maxval.",
        )
    count = _positive_int(spec["count"], f"{key}.count") if "count" in spec else None
    base = spec.get("base", 10.0)
    if kind == "log" and (not _is_number(base) or base <= 0 or base == 1):
        raise _fail(
            f"{key}.base", f"expected a positive number other than 1, got {base!r}", "Use 10."
        )
    out.append(
        Hyperparameter(
            name,
            kind,
            minval=bounds["minval"],
            maxval=bounds["maxval"],
            base=float(base),
            count=count,
        )
    )


def parse_hyperparameters(raw: Any) -> list[Hyperparameter]:
    """Flatten the ``hyperparameters`` section into :class:`Hyperparameter` objects."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise _fail(
            "hyperparameters",
            f"expected a mapping of names to values or specs, received {type(raw).__name__}",
            "Write it like `hyperparameters: {global_batch_size: 32}`.",
        )
    out: list[Hyperparameter] = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not name or "." in name:
            raise _fail(
                f"hyperparameters.{name}",
                "a hyperparameter name must be a non-empty string without dots",
                "Rename it; nest groups as mappings instead of dotted names.",
            )
        _parse_hparam(name, spec, out)
    return out


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


def _parse_searcher(
    raw: Any, hparams: list[Hyperparameter], unit: int, *, script: bool
) -> SearcherConfig:
    if not isinstance(raw, dict):
        raise _fail(
            "searcher",
            f"missing or not a mapping (received {raw!r})",
            "Add e.g. `searcher: {name: single, metric: val_loss, max_length: {batches: 100}}`.",
        )
    for key in raw:
        if key not in _SEARCHER_KEYS:
            raise _fail(
                f"searcher.{key}",
                "unknown key",
                f"Remove it or fix the spelling.{_suggest(str(key), _SEARCHER_KEYS)}",
            )
    name = raw.get("name")
    if name not in SEARCHERS:
        raise _fail(
            "searcher.name",
            f"unknown searcher {name!r}",
            f"Use one of {', '.join(SEARCHERS)}.{_suggest(str(name), set(SEARCHERS))}",
        )
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric:
        raise _fail(
            "searcher.metric",
            f"expected the name of a validation metric, received {metric!r}",
            "Set e.g. `metric: val_loss`.",
        )
    smaller = raw.get("smaller_is_better", True)
    if not isinstance(smaller, bool):
        raise _fail(
            "searcher.smaller_is_better", f"expected true or false, received {smaller!r}", ""
        )
    if "max_length" in raw and "max_steps" in raw:
        raise _fail(
            "searcher.max_length",
            "give only one of `max_length` and `max_steps`",
            "Set e.g. `max_length: {batches: 1000}`.",
        )
    time_metric, max_time = _parse_time_metric(raw, name)
    max_length: Length | None = None
    if "max_length" in raw:
        max_length = parse_length(raw["max_length"], "searcher.max_length", unit)
    elif "max_steps" in raw:
        max_length = Length("batches", _positive_int(raw["max_steps"], "searcher.max_steps") * unit)
    elif time_metric is None and (not script or name == "adaptive_asha"):
        why = (
            "`adaptive_asha` needs `max_length` or `time_metric` + `max_time`"
            if name == "adaptive_asha"
            else "a TFKerasTrial entrypoint needs `max_length` to know how long to train"
        )
        raise _fail(
            "searcher.max_length", f"missing: {why}", "Set e.g. `max_length: {batches: 1000}`."
        )
    if name == "single":
        max_trials = 1
        for hp in hparams:
            if hp.type != "const":
                raise _fail(
                    f"hyperparameters.{hp.name}",
                    f"the `single` searcher needs constant hyperparameters, got type {hp.type!r}",
                    "Use `searcher.name: random` (or grid) to search, or give a constant value.",
                )
    elif name == "grid":
        for hp in hparams:
            if hp.type in ("int", "double", "log") and hp.count is None:
                raise _fail(
                    f"hyperparameters.{hp.name}.count",
                    "the grid searcher needs `count` for int, double and log hyperparameters",
                    "Add e.g. `count: 3`.",
                )
        max_trials = math.prod(len(hp.grid_values()) for hp in hparams) if hparams else 1
    else:
        if "max_trials" not in raw:
            raise _fail(
                "searcher.max_trials",
                "missing",
                f"The `{name}` searcher needs e.g. `max_trials: 8`.",
            )
        max_trials = _positive_int(raw["max_trials"], "searcher.max_trials")
    concurrent = _positive_int(
        raw.get("max_concurrent_trials", 1), "searcher.max_concurrent_trials"
    )
    divisor = _positive_int(raw.get("divisor", 4), "searcher.divisor")
    if divisor < 2:
        raise _fail("searcher.divisor", f"must be at least 2, received {divisor}", "Use 4.")
    max_rungs = _positive_int(raw.get("max_rungs", 5), "searcher.max_rungs")
    mode = raw.get("mode", "standard")
    if mode not in ("standard", "aggressive", "conservative"):
        raise _fail(
            "searcher.mode", f"unknown mode {mode!r}", "Use standard, aggressive or conservative."
        )
    return SearcherConfig(
        name=name,
        metric=metric,
        smaller_is_better=smaller,
        max_length=max_length,
        max_trials=max_trials,
        max_concurrent_trials=concurrent,
        divisor=divisor,
        max_rungs=max_rungs,
        mode=mode,
        time_metric=time_metric,
        max_time=max_time,
    )


def _parse_time_metric(raw: dict[str, Any], name: str) -> tuple[str | None, int | None]:
    """0.38's ``time_metric`` + ``max_time`` (both or neither; ``adaptive_asha`` only)."""
    if "time_metric" not in raw and "max_time" not in raw:
        return None, None
    if name != "adaptive_asha":
        raise _fail(
            "searcher.time_metric",
            f"`time_metric`/`max_time` apply to `adaptive_asha`, not `{name}`",
            "Remove them, or use `name: adaptive_asha`.",
        )
    metric = raw.get("time_metric")
    if not isinstance(metric, str) or not metric:
        raise _fail(
            "searcher.time_metric",
            f"expected the name of a validation metric, received {metric!r}",
            "Set e.g. `time_metric: batches` together with `max_time: 1000`.",
        )
    if "max_time" not in raw:
        raise _fail("searcher.max_time", "missing", "Set e.g. `max_time: 1000`.")
    if "max_length" in raw or "max_steps" in raw:
        raise _fail(
            "searcher.max_length",
            "give `max_length` or `time_metric` + `max_time`, not both",
            "Keep one form.",
        )
    return metric, _positive_int(raw["max_time"], "searcher.max_time")


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
        import shlex

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
    checkpoint_storage: str | dict[str, Any] | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    experiment_seed: int = 0
    max_restarts: int = 0
    perform_initial_validation: bool = False
    ignored_keys: tuple[str, ...] = ()
    #: ``resources.slots_per_trial``: workers started per trial on this machine.
    slots_per_trial: int = 1
    #: ``resources.slots``: workers of a job (``ckptstore job run``).
    slots: int = 1

    def constant_hparams(self) -> dict[str, Any]:
        """Nested hyperparameters when every one is constant (the ``single`` searcher)."""
        return nest_hparams({hp.name: hp.val for hp in self.hyperparameters})

    def gc_settings(self) -> dict[str, int]:
        """Determined's GC keys from ``checkpoint_storage`` (defaults filled in)."""
        settings = dict(GC_KEYS)
        if isinstance(self.checkpoint_storage, dict):
            for key in GC_KEYS:
                if key in self.checkpoint_storage:
                    settings[key] = self.checkpoint_storage[key]
        return settings


def _parse_storage(raw: Any) -> str | dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    if not isinstance(raw, dict):
        raise _fail(
            "checkpoint_storage",
            f"expected a URL or a storage mapping, received {raw!r}",
            "Use e.g. `checkpoint_storage: s3://bucket/prefix` or `{type: shared_fs, host_path: /x}`.",
        )
    if "type" not in raw:
        raise _fail(
            "checkpoint_storage.type",
            "missing",
            "Add `type: s3` (or gcs, azure, shared_fs, directory).",
        )
    for key in GC_KEYS:
        if key in raw:
            _positive_int(raw[key], f"checkpoint_storage.{key}", allow_zero=True)
    return dict(raw)


def _parse_entrypoint(raw: dict[str, Any]) -> Entrypoint:
    value = raw.get("entrypoint", raw.get("entrypoint_script"))
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        import shlex

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
    return Entrypoint(value)


def parse_config(raw: Any) -> ExperimentConfig:
    """Check a config dict and return an :class:`ExperimentConfig`.

    Raises :class:`~ckptstore.errors.InvalidConfig` naming the first bad key and how to fix it.
    """
    if not isinstance(raw, dict):
        raise errors.InvalidConfig(
            f"An experiment config must be a YAML mapping, received {type(raw).__name__}. "
            "Start from examples/mnist_tfkeras_trial/const.yaml."
        )
    ignored: list[str] = []
    for key in raw:
        if key in _IGNORED_TOP:
            ignored.append(key)
        elif key not in _KNOWN_TOP:
            raise _fail(
                str(key),
                "unknown key",
                f"Remove it or fix the spelling.{_suggest(str(key), _KNOWN_TOP | _IGNORED_TOP)}",
            )
    unit = _positive_int(raw.get("scheduling_unit", DEFAULT_SCHEDULING_UNIT), "scheduling_unit")
    hparams = parse_hyperparameters(raw.get("hyperparameters"))
    entrypoint = _parse_entrypoint(raw)
    searcher_raw = raw.get("searcher", DEFAULT_SEARCHER if not entrypoint.is_trial_class else None)
    searcher = _parse_searcher(searcher_raw, hparams, unit, script=not entrypoint.is_trial_class)
    if isinstance(searcher_raw, dict):
        ignored += [f"searcher.{k}" for k in searcher_raw if k in _IGNORED_SEARCHER]
    if entrypoint.is_trial_class and searcher.max_length is None:
        # A TFKerasTrial counts its own time: 0.38's time_metric must be one of its units.
        if searcher.time_metric not in LENGTH_UNITS:
            raise _fail(
                "searcher.time_metric",
                f"a TFKerasTrial counts batches, records or epochs, not {searcher.time_metric!r}",
                "Use `time_metric: batches` (or records, epochs), or `max_length`.",
            )
        assert searcher.max_time is not None
        searcher = dataclasses.replace(
            searcher, max_length=Length(searcher.time_metric, searcher.max_time)
        )
    slots_per_trial, slots = _parse_resources(raw.get("resources"), ignored)
    if entrypoint.is_trial_class and slots_per_trial > 1:
        ignored.append("resources.slots_per_trial (a TFKerasTrial trains on one worker here)")
    if entrypoint.is_trial_class:
        names = {hp.name: hp for hp in hparams}
        gbs = names.get("global_batch_size")
        if gbs is None:
            raise _fail(
                "hyperparameters.global_batch_size",
                "missing; a TFKerasTrial needs it to batch data and count records",
                "Add e.g. `global_batch_size: 32` under `hyperparameters`.",
            )
        values = gbs.grid_values() if gbs.type in ("const", "categorical") else [gbs.minval]
        if gbs.type in ("double", "log") or not all(_is_int(v) and v > 0 for v in values):
            raise _fail(
                "hyperparameters.global_batch_size",
                f"must be a positive integer, received {values!r}",
                "Set e.g. `global_batch_size: 32`.",
            )
    min_val = (
        parse_length(raw["min_validation_period"], "min_validation_period", unit)
        if raw.get("min_validation_period") is not None
        else None
    )
    min_ckpt = (
        parse_length(raw["min_checkpoint_period"], "min_checkpoint_period", unit)
        if raw.get("min_checkpoint_period") is not None
        else None
    )
    rpe = raw.get("records_per_epoch")
    rpe = _positive_int(rpe, "records_per_epoch") if rpe is not None else None
    data = raw.get("data") or {}
    if not isinstance(data, dict):
        raise _fail("data", f"expected a mapping, received {data!r}", "Write `data: {key: value}`.")
    repro = raw.get("reproducibility") or {}
    if not isinstance(repro, dict) or set(repro) - {"experiment_seed"}:
        raise _fail(
            "reproducibility", f"unexpected value {repro!r}", "Use `{experiment_seed: 42}`."
        )
    seed = repro.get("experiment_seed", 0)
    if not _is_int(seed) or seed < 0:
        raise _fail(
            "reproducibility.experiment_seed", f"expected an integer >= 0, received {seed!r}", ""
        )
    description = raw.get("description", raw.get("name", ""))
    if not isinstance(description, str):
        raise _fail("description", f"expected a string, received {description!r}", "Quote it.")
    initial = raw.get("perform_initial_validation", False)
    if not isinstance(initial, bool):
        raise _fail("perform_initial_validation", f"expected true/false, got {initial!r}", "")
    return ExperimentConfig(
        raw=raw,
        description=description,
        hyperparameters=hparams,
        searcher=searcher,
        entrypoint=entrypoint,
        scheduling_unit=unit,
        min_validation_period=min_val,
        min_checkpoint_period=min_ckpt,
        records_per_epoch=rpe,
        checkpoint_storage=_parse_storage(raw.get("checkpoint_storage")),
        data=dict(data),
        experiment_seed=seed,
        max_restarts=_positive_int(raw.get("max_restarts", 0), "max_restarts", allow_zero=True),
        perform_initial_validation=initial,
        ignored_keys=tuple(ignored),
        slots_per_trial=slots_per_trial,
        slots=slots,
    )


def _parse_resources(raw: Any, ignored: list[str]) -> tuple[int, int]:
    """``(slots_per_trial, slots)`` from ``resources``; cluster-only keys go to ``ignored``."""
    if raw is None:
        return 1, 1
    if not isinstance(raw, dict):
        raise _fail(
            "resources",
            f"expected a mapping, received {raw!r}",
            "Write `resources: {slots_per_trial: 2}`.",
        )
    known = _RESOURCE_KEYS | _IGNORED_RESOURCES
    for key in raw:
        if key in _IGNORED_RESOURCES:
            ignored.append(f"resources.{key}")
        elif key not in _RESOURCE_KEYS:
            raise _fail(
                f"resources.{key}",
                "unknown key",
                f"Remove it or fix the spelling.{_suggest(str(key), known)}",
            )
    per_trial = _positive_int(raw.get("slots_per_trial", 1), "resources.slots_per_trial")
    slots = _positive_int(raw.get("slots", 1), "resources.slots")
    return per_trial, slots


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and check a YAML experiment config file.

    Raises :class:`~ckptstore.errors.InvalidConfig` when the file is missing, is not YAML, or
    holds a bad config.
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise errors.InvalidConfig(
            f"Cannot read the experiment config {str(path)!r}: {exc.strerror}. "
            "Pass the path of a YAML file such as examples/mnist_tfkeras_trial/const.yaml."
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.InvalidConfig(
            f"The experiment config {str(path)!r} is not valid YAML: {exc}. Fix the syntax."
        ) from None
    return parse_config(raw)


__all__ = [
    "ExperimentConfig",
    "Entrypoint",
    "Hyperparameter",
    "Length",
    "SearcherConfig",
    "load_config",
    "nest_hparams",
    "parse_config",
    "parse_hyperparameters",
    "parse_length",
]
