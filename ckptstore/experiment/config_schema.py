"""The experiment config's sections as pydantic models (``searcher``, ``resources``,
``environment``, ``reproducibility``, ``checkpoint_storage``): every key Determined 0.38 accepts,
its type, bounds and default, and the rules among a section's own keys as its validator. They
are the runtime config, not a layer in front of one; the rules across sections are
:class:`~ckptstore.experiment.config.ExperimentConfig`'s.

Example::

    from ckptstore.experiment.config import parse_config

    config = parse_config({"entrypoint": "python3 train.py"})
    config.scheduling_unit                      # 100, Determined's default
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ckptstore.checkpointing.retention import DETERMINED_DEFAULTS, run_retention
from ckptstore.experiment.keys import NonNegativeInt, PositiveInt, Section, config_error, ignored
from ckptstore.experiment.lengths import LENGTH_FIX, Length, LengthField

__all__ = ["SEARCHERS", "Length", "Searcher", "StorageBlock"]

#: Searcher names this runner implements (``tpe`` is a ckptstore extension).
SEARCHERS = ("single", "grid", "random", "adaptive_asha", "tpe")
#: More trials than one machine's queue can hold are refused before anything is enqueued
#: (each trial is a row in the Optuna study, created up front).
MAX_TRIALS = 100_000


# ---- sections -----------------------------------------------------------------------------------
def _one_per_cpu(n: int) -> int:
    return n or max(1, os.cpu_count() or 1)


class Searcher(Section):
    """The ``searcher`` section (cross-key rules are in :mod:`~ckptstore.experiment.config`)."""

    # Rules among its own keys are _own_rules below (the docstring is the schema description).
    # ``unit`` changes nothing and is not worth a warning; the other ignored keys are 0.38
    # keys that change nothing here, then keys of searchers older releases removed.
    quiet: ClassVar[frozenset[str]] = frozenset({"unit"})

    name: Literal[SEARCHERS]  # type: ignore[valid-type]
    metric: Annotated[str, Field(min_length=1, examples=["val_loss"])]
    smaller_is_better: bool = True
    #: A :class:`Length` once the config's rules ran (steps and ``max_steps`` in batches,
    #: 0.38's ``time_metric`` + ``max_time`` for a TFKerasTrial); None when the script decides.
    max_length: LengthField | None = None
    max_steps: PositiveInt | None = None
    #: The number of trials once the config's rules ran (1 for ``single``, the grid's size).
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)] | None = None
    max_concurrent_trials: Annotated[
        NonNegativeInt,
        Field(
            description="Trials run at once on this machine (default 1; Determined's is 16). "
            "0, Determined's 'decide for me', is one per CPU."
        ),
        AfterValidator(_one_per_cpu),
    ] = 1
    divisor: Annotated[int, Field(ge=2)] = 4
    max_rungs: PositiveInt = 5
    mode: Literal["standard", "aggressive", "conservative"] = "standard"
    #: 0.38's ASHA form: rungs counted in this validation metric (``batches``, ``epochs``, ...).
    time_metric: Annotated[str, Field(min_length=1)] | None = None
    max_time: PositiveInt | None = None
    __annotations__.update(ignored("unit stop_once bracket_rungs"))
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
    __annotations__.update(ignored("step_budget target_trial_steps train_stragglers budget"))

    @model_validator(mode="after")
    def _own_rules(self) -> Searcher:
        """The rules between this section's keys (those with other sections are the config's)."""
        if self.time_metric is not None or self.max_time is not None:
            self._check_time_metric()
        if self.source_checkpoint_uuid is not None and self.source_trial_id is not None:
            raise config_error(
                "searcher.source_trial_id",
                f"both it ({self.source_trial_id}) and `source_checkpoint_uuid` "
                f"({self.source_checkpoint_uuid!r}) name the checkpoint trials start from",
                "Keep one of them.",
            )
        if self.max_length is not None and self.max_steps is not None:
            problem = "give only one of `max_length` and `max_steps`"
            raise config_error("searcher.max_length", problem, LENGTH_FIX)
        no_length = self.max_length is None and self.max_steps is None
        if self.name == "adaptive_asha" and no_length and self.time_metric is None:
            why = "`adaptive_asha` needs `max_length` or `time_metric` + `max_time`"
            raise config_error("searcher.max_length", f"missing: {why}", LENGTH_FIX)
        if self.name not in ("single", "grid") and self.max_trials is None:
            fix = f"The `{self.name}` searcher needs e.g. `max_trials: 8`."
            raise config_error("searcher.max_trials", "missing", fix)
        return self

    def _check_time_metric(self) -> None:
        """0.38's ``time_metric`` + ``max_time`` (both or neither; ``adaptive_asha`` only)."""
        if self.name != "adaptive_asha":
            raise config_error(
                "searcher.time_metric",
                f"`time_metric`/`max_time` apply to `adaptive_asha`, not `{self.name}`",
                "Remove them, or use `name: adaptive_asha`.",
            )
        if self.time_metric is None:
            raise config_error(
                "searcher.time_metric",
                "expected the name of a validation metric, received None",
                "Set e.g. `time_metric: batches` together with `max_time: 1000`.",
            )
        if self.max_time is None:
            raise config_error("searcher.max_time", "missing", "Set e.g. `max_time: 1000`.")
        if self.max_length is not None or self.max_steps is not None:
            raise config_error(
                "searcher.max_length",
                "give `max_length` or `time_metric` + `max_time`, not both",
                "Keep one form.",
            )

    def search_length(self) -> tuple[str, int] | None:
        """``(unit, amount)`` a trial trains for: ``max_length`` or ``(time_metric, max_time)``;
        None when the script decides (no ``max_length``)."""
        if isinstance(self.max_length, Length):
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
        assert self.max_trials is not None
        rungs = min(self.max_rungs, int(math.log(self.max_trials) / math.log(self.divisor)) + 1)
        points = [max(1, total // self.divisor ** (rungs - 1 - k)) for k in range(rungs)]
        return sorted(set(points))


class Resources(Section):
    """``resources``: ``slots_per_trial`` / ``slots`` start workers here; the rest is the
    cluster's."""

    slots_per_trial: PositiveInt = 1
    slots: PositiveInt = 1
    __annotations__.update(
        ignored("max_slots weight priority resource_pool shm_size devices native_parallel")
        | ignored("is_single_node agent_label")
    )


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


class EnvironmentVariablesByAccelerator(Section):
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


class Environment(Section):
    """``environment``: ``environment_variables`` reach every trial process; the container keys
    are the cluster's."""

    environment_variables: EnvironmentVariables | None = None
    __annotations__.update(
        ignored("image pod_spec registry_auth force_pull_image ports proxy_ports")
        | ignored("add_capabilities drop_capabilities")
    )

    @model_validator(mode="after")
    def _not_the_runners(self) -> Environment:
        from ckptstore.experiment.common import runner_set_env

        taken = sorted(set(self.variables()) & runner_set_env())
        if taken:  # the runner's value would win: refuse rather than ignore the user's silently
            raise config_error(
                "environment.environment_variables",
                f"{', '.join(taken)} is set by ckptstore for every trial, received {taken}",
                "Give storage and registry with --storage/--registry (or checkpoint_storage), "
                "and the data config under `data:`.",
            )
        return self

    def variables(self) -> dict[str, str]:
        """``NAME=value`` entries as a dict (a later entry wins, as in a shell); Determined's
        per-accelerator mapping gives its ``cpu`` list (ckptstore's trials ask for CPUs)."""
        given = self.environment_variables
        if isinstance(given, EnvironmentVariablesByAccelerator):
            given = given.cpu
        return dict(entry.split("=", 1) for entry in given or ())


class Reproducibility(Section):
    """``reproducibility``: ``experiment_seed`` seeds the search, and each trial with its ID. Set,
    every experiment made from the config draws the same hyperparameters, as on Determined;
    unset, each experiment draws its own (its ID seeds its search)."""

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

    @model_validator(mode="after")
    def _names_a_storage(self) -> StorageBlock:
        # GC keys alone are fine: Determined merges them with the cluster's storage.
        given = self.model_dump(exclude_unset=True)
        if self.type is None and not set(given) <= set(DETERMINED_DEFAULTS):
            raise config_error(
                "checkpoint_storage.type",
                f"missing, received keys {sorted(given)}",
                "Add `type: s3` (or gcs, azure, shared_fs, directory).",
            )
        return self

    @property
    def retention(self) -> dict[str, int]:
        """The GC keys it gives (Determined's names)."""
        given = self.model_dump(exclude_unset=True)
        return {k: given[k] for k in DETERMINED_DEFAULTS if given.get(k) is not None}

    def gc_settings(self, *, trial_class: bool) -> dict[str, int] | None:
        """The GC keys a run of this storage keeps its checkpoints by (Determined's defaults
        filled in): always for a TFKerasTrial, for a script only when keys were given."""
        return run_retention(self.retention, trial_class=trial_class)


def _storage_url(url: str) -> str:
    if not url.strip():
        raise config_error(
            "checkpoint_storage",
            f"expected a URL or a storage mapping, received {url!r}",
            "Use e.g. `checkpoint_storage: s3://bucket/prefix` or `{type: s3, bucket: b}`.",
        )
    return url.strip()


StorageSpec = Annotated[
    Annotated[
        str,
        Field(min_length=1, examples=["s3://bucket/prefix"]),
        AfterValidator(_storage_url),
        Tag("storage:url"),
    ]
    | Annotated[StorageBlock, Tag("storage:block")],
    Discriminator(lambda v: "storage:url" if isinstance(v, str) else "storage:block"),
]
