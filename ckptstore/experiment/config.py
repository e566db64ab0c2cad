"""Experiment configs: Determined's YAML keys, parsed and checked before anything runs.

:func:`load_config` reads a YAML file, :func:`parse_config` a dict; both return an
:class:`ExperimentConfig`, a pydantic model whose fields and sections (``config_schema``,
``hparams``, ``lengths``) are the keys, types and defaults and publish the JSON Schema
(:func:`config_json_schema`). A section's own rules are its validator, the rules across sections
this model's, which leave every value in the form the runner uses (lengths in batches,
hyperparameters flat, ``max_trials`` counted). A problem raises one
:class:`~ckptstore.errors.InvalidConfig` naming the dotted key, the value and the fix.

Determined 0.38 configs load unchanged; keys that only mean something on a cluster are listed in
:attr:`ExperimentConfig.ignored_keys`. Configs are untrusted input: the YAML is read by
:mod:`ckptstore.yamlsafe`, a grid or ``max_trials`` larger than a queue can hold or an entrypoint
a shell cannot split is refused before anything runs. This module never imports TensorFlow.

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

import functools
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from ckptstore import errors
from ckptstore.experiment import config_schema as sections
from ckptstore.experiment import keys
from ckptstore.experiment.config_schema import SEARCHERS
from ckptstore.experiment.entrypoint import Entrypoint
from ckptstore.experiment.hparams import (
    HP_TYPES,
    Hyperparameter,
    Hyperparameters,
    nest_hparams,
    parse_hyperparameters,
)
from ckptstore.experiment.keys import config_error
from ckptstore.experiment.lengths import (
    LENGTH_FIX,
    LENGTH_UNITS,
    Length,
    LengthField,
    in_batches,
    parse_length,
    period,
)
from ckptstore.validators import is_int
from ckptstore.yamlsafe import check_size, load_yaml

#: The searcher a config without ``searcher`` gets (the reference's ``entrypoint_script`` form).
DEFAULT_SEARCHER = {"name": "single", "metric": "val_loss", "smaller_is_better": True}
_EXAMPLE = "examples/mnist_tfkeras_trial/const.yaml"


class ExperimentConfig(keys.Section):
    """A whole experiment config: Determined 0.38's keys (``ignored`` ones only mean something
    on a cluster). Where this differs from Determined's default it says so."""

    #: Keys older Determined releases had and later removed: ignored, named in the warning.
    removed: ClassVar[frozenset[str]] = frozenset({"data_layer", "batches_per_step"})
    quiet = removed

    name: str | None = None
    #: The description, else the name, else "" once parsed.
    description: str | None = None
    labels: list[str] | None = None
    #: A flat list of named hyperparameters (nested groups joined by ``.``) once parsed.
    hyperparameters: Hyperparameters | None = None
    #: Always set once parsed (:data:`DEFAULT_SEARCHER` when absent).
    searcher: sections.Searcher | None = None
    #: A :class:`Length`, None when absent or 0, once parsed.
    min_validation_period: LengthField | None = None
    min_checkpoint_period: LengthField | None = None
    #: None when 0, Determined's "unset".
    records_per_epoch: (
        Annotated[keys.NonNegativeInt, AfterValidator(lambda n: n or None)] | None
    ) = None
    scheduling_unit: keys.PositiveInt = 100
    #: A URL or a storage mapping; None for the default storage (also when the block holds only
    #: GC keys, which are then in :attr:`retention`).
    checkpoint_storage: sections.StorageSpec | None = None
    #: An :class:`Entrypoint` once parsed (``entrypoint_script`` is its other name).
    entrypoint: str | list[str] | None = None
    entrypoint_script: str | list[str] | None = None
    #: ``{}`` when absent.
    data: dict[str, Any] | None = None
    reproducibility: sections.Reproducibility | None = None
    max_restarts: Annotated[
        keys.NonNegativeInt, Field(description="Determined's default is 5; here 0 (fail fast).")
    ] = 0
    perform_initial_validation: bool = False
    resources: sections.Resources | None = None
    environment: sections.Environment | None = None
    #: Checkpoints a TFKerasTrial takes after validations
    #: (:class:`~ckptstore.keras_io.trial.controller.TrialController`).
    checkpoint_policy: Annotated[
        Literal["best", "all", "none"],
        Field(
            description="TFKerasTrial: checkpoint after a validation that beats every earlier "
            "one in the experiment (best, Determined's default), after every validation (all) "
            "or only at min_checkpoint_period, the end and preemption (none)."
        ),
    ] = "best"
    __annotations__.update(
        keys.ignored("bind_mounts optimizations profiling workspace project debug pbs slurm")
        | keys.ignored("tensorboard_storage log_policies retention_policy max_slots security")
        | keys.ignored("integrations internal preemption_timeout")
        | keys.ignored("data_layer batches_per_step")  # the removed ones
    )

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)
    _storage: sections.StorageBlock = PrivateAttr(default_factory=sections.StorageBlock)

    @model_validator(mode="after")
    def _rules(self) -> ExperimentConfig:
        """The rules across sections (each section checked its own keys already), in the order
        their errors are reported."""
        unit = self.scheduling_unit
        entrypoint = Entrypoint.parse(self.entrypoint, self.entrypoint_script)
        if self.searcher is None and entrypoint.is_trial_class:
            raise config_error(
                "searcher",
                "missing",
                "Add e.g. `searcher: {name: single, metric: val_loss, max_length: {batches: 100}}`.",
            )
        hparams = self.hyperparameters or []
        searcher = self.searcher or sections.Searcher(**DEFAULT_SEARCHER)
        _searcher_rules(searcher, hparams, unit, trial_class=entrypoint.is_trial_class)
        if entrypoint.is_trial_class:
            _check_batch_size(hparams)
        storage = self.checkpoint_storage
        if isinstance(storage, sections.StorageBlock):
            self._storage = storage
            storage = storage.model_dump(exclude_unset=True) if storage.type else None
        self._set(
            description=self.description if self.description is not None else self.name or "",
            hyperparameters=hparams,
            searcher=searcher,
            entrypoint=entrypoint,
            min_validation_period=period(self.min_validation_period, unit),
            min_checkpoint_period=period(self.min_checkpoint_period, unit),
            checkpoint_storage=storage,
            data=dict(self.data or {}),
        )
        return self

    @property
    def raw(self) -> dict[str, Any]:
        """The dict as given (stored in the registry)."""
        return self._raw

    @property
    def retention(self) -> dict[str, int]:
        """The GC keys given in ``checkpoint_storage`` (Determined's names)."""
        return self._storage.retention

    @property
    def experiment_seed(self) -> int:
        return (self.reproducibility or sections.Reproducibility()).experiment_seed

    @property
    def slots_per_trial(self) -> int:
        """``resources.slots_per_trial``: workers started per trial on this machine."""
        return (self.resources or sections.Resources()).slots_per_trial

    @property
    def slots(self) -> int:
        """``resources.slots``: workers of a job (``ckptstore job run``)."""
        return (self.resources or sections.Resources()).slots

    @property
    def environment_variables(self) -> dict[str, str]:
        """``environment.environment_variables`` as NAME -> value: set in every trial process,
        under ckptstore's own keys (which the config may not set)."""
        return self.environment.variables() if self.environment is not None else {}

    @functools.cached_property
    def ignored_keys(self) -> tuple[str, ...]:
        """The keys accepted for compatibility that change nothing here, in the order given
        (the runner names them in one warning)."""
        raw, script = self.raw, not self.entrypoint.is_trial_class  # type: ignore[union-attr]
        ignored = [k for k in raw if k in self.ignored]
        ignored += [f"{k} (removed from Determined)" for k in raw if k in self.removed]
        for key in ("searcher", "resources", "environment"):
            section = getattr(self, key)
            if raw.get(key) is not None:
                given = section.model_fields_set & type(section).ignored
                ignored += [f"{key}.{k}" for k in raw[key] if k in given]
        if "checkpoint_policy" in raw and script:
            # Determined applies it in its Trial harness only; a script decides its own saves.
            ignored.append("checkpoint_policy (a script checkpoints when it calls upload/save)")
        for key in ("source_checkpoint_uuid", "source_trial_id"):
            if getattr(self.searcher, key) is not None and script:
                # the TFKerasTrial controller warm-starts; a script's latest_checkpoint does not
                ignored.append(f"searcher.{key} (a script loads the checkpoint it wants itself)")
        return tuple(ignored)

    def constant_hparams(self) -> dict[str, Any]:
        """Nested hyperparameters when every one is constant (the ``single`` searcher)."""
        return nest_hparams({hp.name: hp.val for hp in self.hyperparameters})  # type: ignore

    def gc_settings(self) -> dict[str, int]:
        """Determined's GC keys from ``checkpoint_storage`` (defaults filled in), as a
        TFKerasTrial of this config keeps its checkpoints by."""
        return self._storage.gc_settings(trial_class=True) or {}


def ran_with_gc(raw: dict[str, Any]) -> dict[str, int] | None:
    """The GC keys the trials of a stored config (a registry row's) ran with, Determined's
    defaults filled in; None when they ran without a policy: a TFKerasTrial always has one, a
    script only when ``checkpoint_storage`` gave keys. A config ckptstore cannot run (imported,
    hand-made) is judged as a script's, by its ``checkpoint_storage`` block alone."""
    try:
        config = parse_config(raw)
        block, trial_class = config._storage, config.entrypoint.is_trial_class
    except errors.CkptstoreError:
        try:
            given = raw.get("checkpoint_storage") or {}
            block, trial_class = keys.validate_as(_STORAGE, given, "checkpoint_storage"), False
        except errors.InvalidConfig:
            return None
    is_block = isinstance(block, sections.StorageBlock)
    return block.gc_settings(trial_class=trial_class) if is_block else None


def _searcher_rules(
    searcher: sections.Searcher, hparams: list[Hyperparameter], unit: int, *, trial_class: bool
) -> None:
    """``searcher`` checked against the rest of the config, its values put in the form the
    runner uses: ``max_length`` a :class:`Length` (or None), ``max_trials`` counted."""
    s = searcher
    length = s.max_length if s.max_length is not None else s.max_steps
    if length is None and s.time_metric is None and trial_class:
        why = "a TFKerasTrial entrypoint needs `max_length` to know how long to train"
        raise config_error("searcher.max_length", f"missing: {why}", LENGTH_FIX)
    max_length = in_batches(length, "searcher.max_length", unit) if length is not None else None
    max_trials = _max_trials(s, hparams)
    if trial_class and max_length is None:  # a TFKerasTrial counts its own time
        if s.time_metric not in LENGTH_UNITS:
            raise config_error(
                "searcher.time_metric",
                f"a TFKerasTrial counts batches, records or epochs, not {s.time_metric!r}",
                "Use `time_metric: batches` (or records, epochs), or `max_length`.",
            )
        assert s.max_time is not None
        max_length = Length(s.time_metric, s.max_time)
    searcher._set(max_length=max_length, max_trials=max_trials)


def _max_trials(s: sections.Searcher, hparams: list[Hyperparameter]) -> int:
    if s.name == "single":
        for hp in hparams:
            if hp.type != "const":
                raise config_error(
                    f"hyperparameters.{hp.name}",
                    f"the `single` searcher needs constant hyperparameters, got type {hp.type!r}",
                    "Use `searcher.name: random` (or grid) to search, or give a constant value.",
                )
        return 1
    if s.name == "grid":
        for hp in hparams:
            if hp.type in ("int", "double", "log") and hp.count is None:  # type: ignore[union-attr]
                raise config_error(
                    f"hyperparameters.{hp.name}.count",
                    "the grid searcher needs `count` for int, double and log hyperparameters",
                    "Add e.g. `count: 3`.",
                )
        # The product of the sizes, never the grid itself: counts of 10**9 list nothing.
        size = math.prod(hp.grid_size() for hp in hparams)
        if size > sections.MAX_TRIALS:
            raise config_error(
                "hyperparameters",
                f"the grid has {size} points, more than the {sections.MAX_TRIALS} trials an experiment "
                f"may have, received counts {[hp.grid_size() for hp in hparams]}",
                "Lower the `count`s or search with `random`/`tpe` and `max_trials`.",
            )
        return size
    return s.max_trials  # type: ignore[return-value]  # the searcher's own rule requires it


def _check_batch_size(hparams: list[Hyperparameter]) -> None:
    """A TFKerasTrial batches its data with ``global_batch_size``: it must be a positive int."""
    gbs = next((hp for hp in hparams if hp.name == "global_batch_size"), None)
    if gbs is None:
        raise config_error(
            "hyperparameters.global_batch_size",
            # "is a required hyperparameter": Determined's wording, which its tests match
            "missing: global_batch_size is a required hyperparameter; a TFKerasTrial needs it "
            "to batch data and count records",
            "Add e.g. `global_batch_size: 32` under `hyperparameters`.",
            errors.InvalidExperimentException,  # Determined's error for this case
        )
    values = gbs.grid_values() if gbs.type in ("const", "categorical") else [gbs.minval]  # type: ignore[union-attr]
    if gbs.type in ("double", "log") or not all(is_int(v) and v > 0 for v in values):
        raise config_error(
            "hyperparameters.global_batch_size",
            f"must be a positive integer, received {values!r}",
            "Set e.g. `global_batch_size: 32`.",
            errors.InvalidExperimentException,
        )


_STORAGE = TypeAdapter(sections.StorageSpec)


def parse_config(raw: Any) -> ExperimentConfig:
    """Check a config dict and return an :class:`ExperimentConfig`.

    Raises :class:`~ckptstore.errors.InvalidConfig` naming the first bad key and how to fix it.
    """
    check_size(raw)
    if not isinstance(raw, dict):
        raise errors.InvalidConfig(
            f"An experiment config must be a YAML mapping, received {type(raw).__name__}. "
            f"Start from {_EXAMPLE}."
        )
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise keys.as_invalid_config(exc) from None
    config._raw = raw
    return config


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and check a YAML experiment config file.

    Raises :class:`~ckptstore.errors.InvalidConfig` when the file is missing, is not YAML, or
    holds a bad config.
    """
    return parse_config(load_yaml(path, "experiment config", _EXAMPLE))


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an experiment config, as the docs publish it.

    Example::

        import json
        from ckptstore.experiment import config_json_schema

        print(json.dumps(config_json_schema(), indent=2))
    """
    schema = ExperimentConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ckptstore experiment config (Determined 0.38 keys)"
    return schema


__all__ = [
    "ExperimentConfig",
    "Entrypoint",
    "HP_TYPES",
    "Hyperparameter",
    "Length",
    "SEARCHERS",
    "config_json_schema",
    "load_config",
    "nest_hparams",
    "parse_config",
    "parse_hyperparameters",
    "parse_length",
]
