"""Hyperparameter search on Optuna: samplers, pruners and where the study lives.

Searchers map to Optuna as follows:

- ``single``: no study; one trial with the constant hyperparameters.
- ``random``: ``RandomSampler``; ``tpe`` (ckptstore extension): ``TPESampler``;
  ``grid``: ``GridSampler`` over each hyperparameter's ``count`` points / ``vals``.
- ``adaptive_asha``: ``RandomSampler`` with ``SuccessiveHalvingPruner`` (``mode: standard``) or
  ``HyperbandPruner`` (``aggressive``/``conservative``); ``divisor`` is the reduction factor and
  the rungs are Determined's (:meth:`Searcher.rung_lengths`), in the unit of
  ``max_length`` (or ``time_metric``). Trials validate at every rung (the TFKerasTrial
  controller by itself, Core API scripts through ``core_context.searcher.operations()``), report
  the searcher metric there and stop when pruned.

Where the study is stored (:func:`optuna_storage_url`):

- registry on PostgreSQL: the registry's own database, in a separate schema ``optuna`` (so
  Optuna's tables never clash with the registry's). Several machines can then work on one
  search: each runs ``ckptstore experiment resume ID`` against the same registry.
- registry in a SQLite file ``reg.db``: a sibling file ``reg.optuna.db``.
- anything else (in-memory SQLite): a file under ``<ckptstore home>/optuna/``.

Random and TPE samplers are seeded with ``experiment seed + trial number`` for each new trial,
so a search is reproducible and runners sharing a study (same seed) still propose different
values. The experiment seed is ``reproducibility.experiment_seed`` when the config sets it (every
experiment made from the config then draws the same hyperparameters, as on Determined), else the
experiment's id (each experiment draws its own). The study of experiment N is named
``ckptstore-experiment-N-<its creation time in the registry>`` (:func:`resolve_study_name`):
experiment ids start again at 1 in a new registry, and a study left in ``reg.optuna.db`` by a
deleted ``reg.db`` must not be taken for the new experiment's. An experiment an older ckptstore
started keeps its study ``ckptstore-experiment-N``. Optuna's trial has the user attribute
``ckptstore_trial_id`` linking it to the registry trial.

Example::

    searcher = Searcher(config, experiment_id=3, registry_url="sqlite:////tmp/reg.db")
    hparams, optuna_id = searcher.ask()
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptstore import defaults, errors
from ckptstore.experiment.config import ExperimentConfig, Hyperparameter, nest_hparams

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec

logger = logging.getLogger(__name__)

TRIAL_ATTR = "ckptstore_trial_id"
OPTUNA_SCHEMA = "optuna"
_PRIMITIVE = (str, int, float, bool, type(None))


def study_name(experiment_id: int, created_at: _dt.datetime | None = None) -> str:
    """The study of experiment ``experiment_id`` created at ``created_at`` (the registry's
    ``Experiment.created_at``); without it, the name an older ckptstore gave every study."""
    if created_at is None:
        return f"ckptstore-experiment-{experiment_id}"
    return f"ckptstore-experiment-{experiment_id}-{created_at:%Y%m%dT%H%M%S%f}"


def resolve_study_name(registry: Registry, experiment_id: int, storage: Any) -> str:
    """The name of experiment ``experiment_id``'s study in the Optuna ``storage``.

    New experiments get a name with their creation time, so a new registry's experiment 1
    never opens the study a deleted registry's experiment 1 left in the same Optuna database.
    The name an older ckptstore used (``ckptstore-experiment-N``) is kept only for a study
    whose trials are all this experiment's in the registry (an experiment started before the
    upgrade); any other is a stale study from an earlier registry, left alone."""
    import optuna

    created = registry.get_experiment(experiment_id).created_at
    name = study_name(experiment_id, created)
    names = set(optuna.get_all_study_names(storage=storage))
    legacy = study_name(experiment_id)
    if name in names or legacy not in names:
        return name
    study = optuna.load_study(study_name=legacy, storage=storage)
    linked = {int(t.user_attrs[TRIAL_ATTR]) for t in study.trials if TRIAL_ATTR in t.user_attrs}
    ours = {t.id for t in registry.list_trials(experiment_id)}
    if linked and linked <= ours:
        return legacy
    logger.info(
        "Optuna study %r belongs to an earlier registry's experiment %d (its trials %s are "
        "not this experiment's); experiment %d uses study %r.",
        legacy,
        experiment_id,
        sorted(linked),
        experiment_id,
        name,
    )
    return name


def optuna_storage_url(registry_url: str) -> tuple[str, dict[str, Any]]:
    """``(url, engine_kwargs)`` of the Optuna storage that goes with a registry URL."""
    url = registry_url
    if url.startswith(("postgres://", "postgresql://", "postgresql+psycopg://")):
        url = url.replace("postgres://", "postgresql://", 1)
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://") :]
        _ensure_pg_schema(url)
        return url, {"connect_args": {"options": f"-csearch_path={OPTUNA_SCHEMA}"}}
    path: Path | None = None
    if url.startswith("sqlite:///"):
        rest = url[len("sqlite:///") :]
        if rest and rest != ":memory:":
            path = Path(rest)
    elif "://" not in url:
        path = Path(url)
    if path is not None:
        target = path.with_name(path.stem + ".optuna.db")
    else:
        target = defaults.home() / "optuna" / "studies.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{target}", {"connect_args": {"timeout": 60}}


def _ensure_pg_schema(url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
    except sa.exc.IntegrityError:
        pass  # another process created it at the same moment
    finally:
        engine.dispose()


def open_optuna_storage(registry_url: str, **options: Any) -> Any:
    """The Optuna ``RDBStorage`` that goes with a registry URL (``options`` go to it).

    Processes opening a new database together (runners, ``describe``, a poller) race on
    creating Optuna's tables and its alembic version table; the loser sees an IntegrityError
    or "already exists" and finds them there on the next try, so this retries (5 tries)."""
    import warnings

    import optuna

    url, engine_kwargs = optuna_storage_url(registry_url)
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **options)
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            if attempt == 4:
                raise errors.RegistryError(
                    "Could not open the Optuna study storage for this registry "
                    f"({type(exc).__name__}). Check that the registry database is reachable "
                    "and writable."
                ) from exc
            logger.info("Opening the Optuna storage failed (%s); retrying", type(exc).__name__)
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def _categorical_choices(hp: Hyperparameter) -> tuple[list[Any], bool]:
    values = list(hp.vals if hp.type == "categorical" else hp.grid_values())
    if all(isinstance(v, _PRIMITIVE) for v in values):
        return values, False
    return list(range(len(values))), True  # lists/dicts: choose an index


def _grid_sampler_class() -> Any:
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its ``study.stop()`` once the grid is used up (that
        only works inside ``study.optimize``); the runner stops at ``max_trials`` itself."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return AskTellGridSampler


def _AskTellGridSampler(space: dict[str, list[Any]], seed: int) -> Any:  # noqa: N802
    return _grid_sampler_class()(space, seed=seed)


class _EachTrialOnce:
    """The study as the pruner sees it: a trial handed back (paused) and continued as Optuna's
    retry copy (which inherits its rung values) counts once among the values at a rung, not
    twice (the failed original and the copy)."""

    def __init__(self, study: Any) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        trials = self._study.get_trials(deepcopy=deepcopy, states=states)
        retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
        return [t for t in trials if t.number not in retried]


def _successive_halving_class() -> Any:
    import optuna

    class EachTrialOncePruner(optuna.pruners.SuccessiveHalvingPruner):
        """Optuna's successive halving over :class:`_EachTrialOnce`."""

        def prune(self, study: Any, trial: Any) -> bool:
            return super().prune(_EachTrialOnce(study), trial)

    return EachTrialOncePruner


class Searcher:
    """Proposes hyperparameters for new trials and judges pruning, on an Optuna study.

    Args:
        config: the experiment config.
        experiment_id: the registry id of the experiment (names the study).
        registry_url: the registry's URL, with password (see :func:`optuna_storage_url`).
        storage: the Optuna storage to open the study on; default: a plain ``RDBStorage`` at
            :func:`optuna_storage_url` (the runner passes one with heartbeats, see
            :mod:`ckptstore.experiment.optuna_queue`).
        study: the study's name; default: :func:`resolve_study_name` in the registry at
            ``registry_url`` (:func:`study_name` of the id alone when the registry has no such
            experiment).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        experiment_id: int,
        registry_url: str,
        storage: StorageSpec | None = None,
        *,
        study: str | None = None,
    ) -> None:
        import optuna

        from ckptstore.registry import Registry

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.config = config
        self.experiment_id = experiment_id
        s = config.searcher
        # A seed the config sets repeats the search in every experiment made from it, as
        # Determined's master seeds its searcher with reproducibility.experiment_seed alone;
        # without one each experiment draws its own (0 + its ID; Determined: the time).
        given = config.reproducibility
        seed = config.experiment_seed
        if given is None or "experiment_seed" not in given.model_fields_set:
            seed += experiment_id
        self._seed = seed
        if s.name == "grid":
            space = {
                hp.name: _categorical_choices(hp)[0]
                for hp in config.hyperparameters
                if hp.type != "const"
            }
            sampler: Any = _AskTellGridSampler(space or {"_": [0]}, seed=seed)
        elif s.name == "tpe":
            sampler = optuna.samplers.TPESampler(seed=seed)
        else:
            sampler = optuna.samplers.RandomSampler(seed=seed)
        if storage is None:
            storage = open_optuna_storage(registry_url)
        if study is None:
            with Registry(registry_url) as registry:
                try:
                    study = resolve_study_name(registry, experiment_id, storage)
                except errors.ExperimentNotFound:  # a search outside any registry experiment
                    study = study_name(experiment_id)
        for attempt in range(3):
            try:
                self.study = optuna.create_study(
                    storage=storage,
                    study_name=study,
                    sampler=sampler,
                    pruner=self._pruner(),
                    direction="minimize" if s.smaller_is_better else "maximize",
                    load_if_exists=True,
                )
                break
            except Exception:  # noqa: BLE001 - runners starting together race on Optuna's tables
                if attempt == 2:
                    raise
                logger.info("Opening the Optuna study failed; retrying", exc_info=True)
                time.sleep(1.0 + attempt)

    def _pruner(self) -> Any:
        import optuna

        s = self.config.searcher
        if s.name != "adaptive_asha":
            return optuna.pruners.NopPruner()
        rungs = s.rung_lengths()
        if s.mode == "standard":
            return _successive_halving_class()(min_resource=rungs[0], reduction_factor=s.divisor)
        return optuna.pruners.HyperbandPruner(
            min_resource=rungs[0], max_resource=rungs[-1], reduction_factor=s.divisor
        )

    def ask(self) -> tuple[dict[str, Any], int]:
        """``(nested hparams, optuna trial id)`` for a new trial."""
        trial = self.study.ask()
        return self.suggest(trial), trial._trial_id

    def suggest(self, trial: Any) -> dict[str, Any]:
        """Nested hparams for an Optuna trial already started (asked, or popped from the
        study's queue); a retried trial gets back the values it had."""
        if self.config.searcher.name in ("random", "tpe", "adaptive_asha"):
            # A sampler seeded by the trial number: runners sharing the study (same seed) then
            # propose different values, and a search stays reproducible.
            self.study.sampler = self._sampler_for(self._seed + trial.number)
        return self._suggest(trial)

    def _sampler_for(self, seed: int) -> Any:
        import optuna

        if self.config.searcher.name == "tpe":
            return optuna.samplers.TPESampler(seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)

    def _suggest(self, trial: Any) -> dict[str, Any]:
        grid = self.config.searcher.name == "grid"
        flat: dict[str, Any] = {}
        for hp in self.config.hyperparameters:
            if hp.type == "const":
                flat[hp.name] = hp.val
            elif hp.type == "categorical" or grid:
                choices, by_index = _categorical_choices(hp)
                picked = trial.suggest_categorical(hp.name, choices)
                values = list(hp.vals if hp.type == "categorical" else hp.grid_values())
                flat[hp.name] = values[picked] if by_index else picked
            elif hp.type == "int":
                flat[hp.name] = trial.suggest_int(hp.name, int(hp.minval), int(hp.maxval))
            elif hp.type == "double":
                flat[hp.name] = trial.suggest_float(hp.name, float(hp.minval), float(hp.maxval))
            else:  # log: minval/maxval are exponents of base
                low, high = hp.base ** float(hp.minval), hp.base ** float(hp.maxval)
                flat[hp.name] = trial.suggest_float(hp.name, low, high, log=True)
        return nest_hparams(flat)

    def link(self, optuna_id: int, trial_id: int) -> None:
        """Record which registry trial an Optuna trial belongs to."""
        self.study._storage.set_trial_user_attr(optuna_id, TRIAL_ATTR, trial_id)

    def optuna_ids(self) -> dict[int, int]:
        """``{registry trial id: optuna trial id}`` for every linked Optuna trial."""
        out = {}
        for t in self.study.get_trials(deepcopy=False):
            tid = t.user_attrs.get(TRIAL_ATTR)
            if tid is not None:
                out[int(tid)] = t._trial_id
        return out

    def is_finished(self, optuna_id: int) -> bool:
        return self.study._storage.get_trial(optuna_id).state.is_finished()

    def tell(self, optuna_id: int, value: float | None) -> None:
        """Finish an Optuna trial with its final searcher metric (failed when None)."""
        import optuna

        if self.is_finished(optuna_id):
            return
        number = self.study._storage.get_trial(optuna_id).number
        if value is None or not math.isfinite(value):
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(number, value)

    def should_prune(self, optuna_id: int, step: int, value: float) -> bool:
        """Report an intermediate value at ``step`` (in the unit of ``max_length`` /
        ``time_metric``); True when the pruner stops the trial (it is then told PRUNED)."""
        import optuna

        if self.config.searcher.name != "adaptive_asha":
            return False
        trial = optuna.trial.Trial(self.study, optuna_id)
        trial.report(value, step)
        if trial.should_prune():
            number = self.study._storage.get_trial(optuna_id).number
            self.study.tell(number, state=optuna.trial.TrialState.PRUNED)
            return True
        return False


def oracle_from_env() -> Callable[[int, float], bool]:
    """The pruning decision of the trial this process runs, for ``core_context.searcher``
    (named in ``CKPTSTORE_SEARCHER_ORACLE`` by the runner): ``oracle(rung_length, metric)``
    reports the metric to the experiment's Optuna study and returns True when the trial is
    pruned. A trial without an Optuna id never stops early."""
    from ckptstore.core import info as trial_info
    from ckptstore.experiment.common import OPTUNA_TRIAL_ENV, experiment_config
    from ckptstore.experiment.config import parse_config
    from ckptstore.registry import Registry

    optuna_id = trial_info.parse_int_env(OPTUNA_TRIAL_ENV)
    experiment_id = trial_info.parse_int_env(trial_info.EXPERIMENT_ID_ENV)
    if optuna_id is None or experiment_id is None:
        return lambda length, value: False
    registry_url = os.environ.get(trial_info.REGISTRY_ENV) or defaults.default_registry_url()
    with Registry(registry_url) as registry:
        config = parse_config(experiment_config(registry, experiment_id))
    searcher = Searcher(config, experiment_id, registry_url)

    def oracle(length: int, value: float) -> bool:
        return searcher.should_prune(optuna_id, length, value)

    return oracle


__all__ = [
    "Searcher",
    "optuna_storage_url",
    "oracle_from_env",
    "resolve_study_name",
    "study_name",
]
