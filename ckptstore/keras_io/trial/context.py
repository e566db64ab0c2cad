"""TFKerasTrialContext: what a TFKerasTrial sees of its trial (hparams, config, wrappers, fit args)."""

from __future__ import annotations

import copy
import logging
import pathlib
import random
from collections.abc import Callable
from typing import Any

from ckptstore import errors
from ckptstore.keras_io._types import KerasModel
from ckptstore.validators import int_at_least, optional_int_at_least

logger = logging.getLogger(__name__)


class _ArgNotProvided:
    """Marks a ``configure_fit`` keyword that was not given (None is a real value for some)."""

    def __repr__(self) -> str:
        return "<not provided>"


NOT_PROVIDED: Any = _ArgNotProvided()

#: ``configure_fit`` keywords (Determined's) and Keras's defaults for them.
FIT_DEFAULTS: dict[str, Any] = {
    "verbose": False,
    "class_weight": None,
    "workers": None,
    "use_multiprocessing": False,
    "max_queue_size": 10,
    "shuffle": None,
    "validation_steps": None,
}


class _SingleProcess:
    """Rank 0 of 1, used when no distributed context is given."""

    rank = local_rank = cross_rank = 0
    size = local_size = cross_size = 1

    def get_rank(self) -> int:
        return 0

    def get_local_rank(self) -> int:
        return 0

    def get_size(self) -> int:
        return 1

    def get_num_agents(self) -> int:
        return 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    allgather_local = allgather
    gather_local = gather
    broadcast_local = broadcast

    def close(self) -> None:
        pass


def _default_distributed() -> Any:
    try:
        from ckptstore.checkpointing.distributed import ProcessGroup as DistributedContext
    except ImportError:
        return _SingleProcess()
    single = getattr(DistributedContext, "single", None)
    return single() if callable(single) else _SingleProcess()


class TFKerasExperimentalContext:
    """``context.experimental``: Determined's experimental features of the trial API.

    ``cache_train_dataset`` / ``cache_validation_dataset`` are decorators for functions that
    build a ``tf.data.Dataset``; here they cache the dataset in memory (``Dataset.cache()``).

    Example::

        @self.context.experimental.cache_train_dataset("mnist", "v1", shuffle=True)
        def make_dataset():
            return tf.data.Dataset.from_tensor_slices((x, y))
    """

    def cache_train_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return self._cache(dataset_id, dataset_version, shuffle)

    def cache_validation_dataset(
        self, dataset_id: str, dataset_version: str, shuffle: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return self._cache(dataset_id, dataset_version, shuffle)

    @staticmethod
    def _cache(
        dataset_id: str, version: str, shuffle: bool
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorator(make: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                ds = make(*args, **kwargs)
                logger.info("caching dataset %s (version %s) in memory", dataset_id, version)
                ds = ds.cache()
                if shuffle:
                    ds = ds.shuffle(1024, reshuffle_each_iteration=True)
                return ds

            return wrapped

        return decorator


def _draw(hp: Any, rng: random.Random) -> Any:
    """One value of a :class:`~ckptstore.experiment.config.Hyperparameter`."""
    if hp.type == "const":
        return hp.val
    if hp.type == "categorical":
        return rng.choice(list(hp.vals))
    if hp.type == "int":
        return rng.randint(int(hp.minval), int(hp.maxval))
    if hp.type == "log":
        return float(hp.base ** rng.uniform(hp.minval, hp.maxval))
    return rng.uniform(hp.minval, hp.maxval)


#: ``context.env`` fields that ckptstore computes from the trial itself: reading them always
#: agrees with the context (hparams, ids, resume point), so they cannot be assigned.
_ENV_FROM_CONTEXT = (
    "experiment_config",
    "hparams",
    "det_trial_id",
    "det_experiment_id",
    "trial_seed",
    "steps_completed",
    "latest_checkpoint",
    "global_batch_size",
    "per_slot_batch_size",
)


class TrialEnv:
    """``context.env``: what Determined's ``EnvContext`` told a trial about where it runs.

    One object per context, as in Determined, so what a trial assigns stays. Fields a Keras trial
    reads keep Determined's names. The cluster-only ones (master URL, agent, GPUs, slots) start
    empty because there is no cluster, and a trial may assign them as Determined allowed (0.17's
    examples set ``context.env.container_gpus = []``); ckptstore reads none of them. The fields
    ckptstore derives from the trial (:data:`_ENV_FROM_CONTEXT`) are read live from the context
    and refuse assignment, so ``env.hparams`` and ``context.get_hparams()`` never disagree.

    Example::

        context = TFKerasTrialContext({"global_batch_size": 32})
        context.env.container_gpus = []      # a Determined 0.17 trial's line: accepted
        context.env.hparams["global_batch_size"]   # 32
    """

    def __init__(self, context: TFKerasTrialContext) -> None:
        object.__setattr__(self, "_context", context)
        self.trial_run_id = 1
        self.on_cluster = False
        self.debug = False
        self.use_gpu = False
        self.master_url = ""
        self.det_agent_id = ""
        self.det_cluster_id = ""
        self.container_id = ""
        self.container_gpus: list[str] = []
        self.slot_ids: list[int] = []
        self.managed_training = True
        self.test_mode = False

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _ENV_FROM_CONTEXT:
            raise errors.InvalidConfig(
                f"context.env.{name} is computed from the trial (hyperparameters, ids, resume "
                "point) and cannot be assigned; change the experiment config or the context "
                f"instead. Received: context.env.{name} = {value!r}."
            )
        object.__setattr__(self, name, value)

    @property
    def experiment_config(self) -> dict[str, Any]:
        return self._context.get_experiment_config()

    @property
    def hparams(self) -> dict[str, Any]:
        return self._context.get_hparams()

    @property
    def det_trial_id(self) -> str:
        trial_id = self._context.trial_id
        return str(trial_id) if trial_id is not None else ""

    @property
    def det_experiment_id(self) -> str:
        experiment_id = self._context.experiment_id
        return str(experiment_id) if experiment_id is not None else ""

    @property
    def trial_seed(self) -> int:
        return self._context.trial_seed

    @property
    def steps_completed(self) -> int:
        return self._context.initial_batch

    @property
    def latest_checkpoint(self) -> str | None:
        core = self._context._core
        return getattr(core.info, "latest_checkpoint", None) if core is not None else None

    @property
    def global_batch_size(self) -> int:
        return self._context.get_global_batch_size()

    @property
    def per_slot_batch_size(self) -> int:
        return self._context.get_per_slot_batch_size()


class TFKerasTrialContext:
    """The runtime information of one trial, passed to ``TFKerasTrial.__init__``.

    Holds the trial's hyperparameters, the experiment config and its ``data`` section, the
    distributed context (``.distributed``), experimental features (``.experimental``), and the
    ``model.fit()`` settings from :meth:`configure_fit`. The trial controller creates it; tests
    may create one directly.

    Args:
        hparams: the trial's hyperparameters (must hold ``global_batch_size`` for training).
        experiment_config: the experiment config as a dict.
        distributed: a DistributedContext; one process when omitted.
        trial_id: the registry id of the trial, if any.
        experiment_id: the registry id of the experiment, if any.
        trial_seed: seed of this trial's random number generators.
        core_context: the trial's core context (for :meth:`get_tensorboard_path`).

    Example::

        context = TFKerasTrialContext({"global_batch_size": 32, "lr": 0.01})
        context.get_hparam("lr")            # 0.01
        context.configure_fit(workers=2)
        context.configure_fit(shuffle=False)
        context.fit_config["workers"]       # 2: later calls keep earlier settings
    """

    def __init__(
        self,
        hparams: dict[str, Any],
        *,
        experiment_config: dict[str, Any] | None = None,
        distributed: Any = None,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        trial_seed: int = 0,
        core_context: Any = None,
    ) -> None:
        self._core = core_context
        self._stop_requested = False
        #: Batches trained when the trial (re)started; the controller sets it after a resume.
        self.initial_batch = 0
        self._hparams = dict(hparams)
        self._config = dict(experiment_config or {})
        self.distributed = distributed if distributed is not None else _default_distributed()
        self.experimental = TFKerasExperimentalContext()
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self.trial_seed = trial_seed
        self._fit: dict[str, Any] = dict(FIT_DEFAULTS)
        self.models: list[Any] = []
        self.optimizers: list[Any] = []
        #: Determined's attributes: the last wrapped model; the rest are harness state that
        #: ckptstore's controller keeps itself (left at Determined's initial values).
        self.model: KerasModel | None = None
        self.compile_args: Any = None
        self.train_config: Any = None
        self.dataset_initialized = False
        self._env = TrialEnv(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TFKerasTrialContext:
        """A context for trying a trial class outside an experiment (Determined's debugging
        helper): hyperparameters are drawn once from the config's ``hyperparameters`` (``const``
        values as they are, ranges and categories at random, seeded by
        ``reproducibility.experiment_seed``).

        Example::

            context = det.keras.TFKerasTrialContext.from_config(yaml.safe_load(open("const.yaml")))
            model = MyTrial(context).build_model()
        """
        from ckptstore.experiment.config import nest_hparams, parse_hyperparameters

        if not isinstance(config, dict):
            raise errors.InvalidConfig(
                f"from_config needs the experiment config as a dict. Received: {config!r}."
            )
        seed = (config.get("reproducibility") or {}).get("experiment_seed", 0)
        rng = random.Random(seed)
        flat = {
            hp.name: _draw(hp, rng) for hp in parse_hyperparameters(config.get("hyperparameters"))
        }
        return cls(nest_hparams(flat), experiment_config=config)

    # ---- hyperparameters and config -----------------------------------------------------------
    def get_hparams(self) -> dict[str, Any]:
        """A copy of every hyperparameter of this trial."""
        return copy.deepcopy(self._hparams)

    def get_hparam(self, name: str) -> Any:
        """One hyperparameter; :class:`~ckptstore.errors.InvalidConfig` naming the known ones if
        ``name`` is not defined."""
        if name not in self._hparams:
            known = ", ".join(sorted(self._hparams)) or "none"
            raise errors.InvalidConfig(
                f"Hyperparameter {name!r} is not defined for this trial (defined: {known}). "
                f"Add it under `hyperparameters` in the experiment config."
            )
        return self._hparams[name]

    def get_experiment_config(self) -> dict[str, Any]:
        """The experiment config as a dict."""
        return copy.deepcopy(self._config)

    def get_data_config(self) -> dict[str, Any]:
        """The experiment config's ``data`` section (``{}`` if none)."""
        return copy.deepcopy(self._config.get("data") or {})

    def get_trial_id(self) -> int | None:
        return self.trial_id

    def get_experiment_id(self) -> int | None:
        return self.experiment_id

    def get_trial_seed(self) -> int:
        return self.trial_seed

    def get_initial_batch(self) -> int:
        """Batches already trained when this run of the trial started (0 unless resumed)."""
        return self.initial_batch

    @property
    def env(self) -> TrialEnv:
        """Determined's ``context.env`` (experiment config, hparams, ids, seed, steps): one
        object per context, see :class:`TrialEnv`."""
        return self._env

    def get_stop_requested(self) -> bool:
        """Whether the trial asked to stop early (:meth:`set_stop_requested`)."""
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask the controller to stop this trial after the current batch, as Determined does:
        it validates, checkpoints and ends the trial as completed early."""
        if not isinstance(stop_requested, bool):
            raise errors.InvalidConfig(
                f"stop_requested must be a bool. Received: stop_requested={stop_requested!r}."
            )
        self._stop_requested = stop_requested

    def get_tensorboard_path(self) -> pathlib.Path:
        """The local folder for TensorBoard files that is synced to
        ``<storage>/tensorboard/<trial id>/`` (``core_context.train.get_tensorboard_path()``)."""
        if self._core is None:
            raise errors.InvalidConfig(
                "This TFKerasTrialContext has no core context; create it with "
                "core_context=... (the trial controller does) to get a TensorBoard path."
            )
        return self._core.train.get_tensorboard_path()

    def get_global_batch_size(self) -> int:
        """The ``global_batch_size`` hyperparameter: records per batch across all workers."""
        # Determined raises InvalidExperimentException for both a missing and a bad value.
        if "global_batch_size" not in self._hparams:
            raise errors.InvalidExperimentException(
                # Determined's wording, which its tests (and users' scripts) match
                "global_batch_size is a required hyperparameter: a TFKerasTrial needs an "
                "integer `global_batch_size`; add e.g. `global_batch_size: 32` under "
                "`hyperparameters` in the experiment config. "
                f"Received: hyperparameters {sorted(self._hparams)!r}."
            )
        value = self._hparams["global_batch_size"]
        return int_at_least(
            "global_batch_size",
            value,
            1,
            error=errors.InvalidExperimentException,
            hint=" (a hyperparameter).",
        )

    def get_per_slot_batch_size(self) -> int:
        """``global_batch_size`` divided by the number of workers (slots)."""
        size = self.distributed.get_size()
        gbs = self.get_global_batch_size()
        if gbs % size:
            logger.warning(
                "global_batch_size %d is not divisible by %d workers; using %d per worker",
                gbs,
                size,
                gbs // size,
            )
        return max(1, gbs // size)

    # ---- wrappers ---------------------------------------------------------------------------------
    def wrap_model(self, model: KerasModel) -> KerasModel:
        """Register ``model`` (call before compiling it) and return it for use in its place."""
        self.models.append(model)
        self.model = model
        return model

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Register ``optimizer`` so its state is checkpointed, and return it."""
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_dataset(self, dataset: Any, shard_dataset: bool = True) -> Any:
        """Shard a ``tf.data.Dataset`` so each worker sees its own part (with several workers and
        ``shard_dataset=True``) and return it; wrap datasets right after creating them."""
        size = self.distributed.get_size()
        if shard_dataset and size > 1:
            return dataset.shard(size, self.distributed.get_rank())
        return dataset

    # ---- fit settings -----------------------------------------------------------------------------
    def configure_fit(
        self,
        verbose: bool | None = None,
        class_weight: Any = NOT_PROVIDED,
        workers: int | None = None,
        use_multiprocessing: bool | None = None,
        max_queue_size: int | None = None,
        shuffle: bool | None = None,
        validation_steps: Any = NOT_PROVIDED,
    ) -> None:
        """Settings for ``model.fit()``; keywords not given keep what earlier calls set.

        Example::

            self.context.configure_fit(verbose=False, workers=5)
            self.context.configure_fit(use_multiprocessing=True)   # workers stays 5
        """
        given = {
            "verbose": verbose,
            "class_weight": class_weight,
            "workers": workers,
            "use_multiprocessing": use_multiprocessing,
            "max_queue_size": max_queue_size,
            "shuffle": shuffle,
            "validation_steps": validation_steps,
        }
        for key in ("workers", "max_queue_size"):
            value = given[key]
            low = 0 if key == "workers" else 1
            optional_int_at_least(key, value, low)
        vs = given["validation_steps"]
        if vs is not NOT_PROVIDED and vs is not None and (not isinstance(vs, int) or vs < 1):
            raise errors.InvalidConfig(
                f"configure_fit(validation_steps=...) needs a positive integer or None. "
                f"Received: validation_steps={vs!r}."
            )
        for key, value in given.items():
            if key in ("class_weight", "validation_steps"):
                if value is not NOT_PROVIDED:
                    self._fit[key] = value
            elif value is not None:
                self._fit[key] = value

    @property
    def fit_config(self) -> dict[str, Any]:
        """The merged ``configure_fit`` settings (a copy)."""
        return dict(self._fit)


__all__ = ["TFKerasExperimentalContext", "TFKerasTrialContext", "TrialEnv"]
