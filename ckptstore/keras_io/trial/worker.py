"""One trial of a ``model_def:TrialClass`` experiment, run in its own process by the runner.

``python -m ckptstore.keras_io.trial.worker`` reads the trial from the environment
(``CKPTSTORE_TRIAL_ID``, ``CKPTSTORE_EXPERIMENT_ID``, ``CKPTSTORE_HPARAMS``,
``CKPTSTORE_STORAGE``, ``CKPTSTORE_REGISTRY``; see :mod:`ckptstore.core.info`) plus
``CKPTSTORE_MODEL_DIR`` and ``CKPTSTORE_OPTUNA_TRIAL``, loads the experiment config from the
registry, imports the trial class from the model folder and trains it with
:class:`~ckptstore.keras_io.trial.controller.TrialController`. It resumes from the trial's latest
checkpoint (or, for a trial with none yet, warm-starts from the checkpoint ``searcher.source_checkpoint_uuid``
/ ``source_trial_id`` name), and sets the trial COMPLETED (done, stopped early or pruned), PAUSED (preempted by
SIGTERM/SIGINT) or ERROR in the registry. Exit status: 0 unless the trial failed.

With a ``TF_CONFIG`` naming several workers (``resources.slots_per_trial: N > 1``: Determined's
TensorFlow launcher here, or Ray Train's workers) this process is one of N under
``MultiWorkerMirroredStrategy``; only rank 0 writes checkpoints and sets the trial's state.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core import info as trial_info
from ckptstore.experiment.common import MODEL_DIR_ENV, OPTUNA_TRIAL_ENV, experiment_config

if TYPE_CHECKING:
    from ckptstore.core import DistributedContext
    from ckptstore.experiment.config import ExperimentConfig
    from ckptstore.registry import Registry
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)


def import_trial_class(model_dir: str, module_name: str, attr: str) -> Any:
    """Import ``module_name:attr`` from ``model_dir``; InvalidConfig naming what is missing."""
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:
            raise
        raise errors.InvalidConfig(
            f"entrypoint module {module_name!r} was not found in the model folder {model_dir!r}. "
            f"Pass the folder holding {module_name.replace('.', '/')}.py as MODEL_DIR."
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise errors.InvalidConfig(
                f"entrypoint {module_name}:{attr}: module {module_name!r} has no {part!r}. "
                "Fix `entrypoint` in the experiment config."
            )
        obj = getattr(obj, part)
    return obj


def run_trial() -> int:
    """Run the trial described by the environment; returns the exit status."""
    from ckptstore import core
    from ckptstore.experiment.config import parse_config
    from ckptstore.keras_io.trial import TrialController
    from ckptstore.registry import Registry
    from ckptstore.storage_backends.spec import resolve

    trial_id = trial_info.parse_int_env(trial_info.TRIAL_ID_ENV)
    experiment_id = trial_info.parse_int_env(trial_info.EXPERIMENT_ID_ENV)
    if trial_id is None or experiment_id is None:
        raise errors.InvalidConfig(
            f"{trial_info.TRIAL_ID_ENV} and {trial_info.EXPERIMENT_ID_ENV} must be set; this "
            "module is started by `ckptstore experiment create/resume`."
        )
    registry_url = os.environ.get(trial_info.REGISTRY_ENV) or None
    model_dir = os.environ.get(MODEL_DIR_ENV) or os.getcwd()
    optuna_id = trial_info.parse_int_env(OPTUNA_TRIAL_ENV)
    registry = Registry(registry_url)
    try:
        config = parse_config(experiment_config(registry, experiment_id))
        hparams = trial_info.parse_json_env(trial_info.HPARAMS_ENV)
        if hparams is None:
            hparams = registry.get_trial(trial_id).hparams
        assert config.entrypoint.module and config.entrypoint.attr
        trial_class = import_trial_class(
            model_dir, config.entrypoint.module, config.entrypoint.attr
        )
        prune_hook = None
        if optuna_id is not None and config.searcher.name == "adaptive_asha":
            from ckptstore.experiment.searcher import Searcher

            searcher = Searcher(config, experiment_id, registry_url or _default_registry())

            def prune_hook(step: int, value: float) -> bool:
                return searcher.should_prune(optuna_id, step, value)

        storage = resolve()  # the runner's CKPTSTORE_STORAGE, with the config's retention keys
        distributed, strategy = _distributed()
        chief = distributed is None or distributed.rank == 0
        try:
            with core.init(
                storage=storage,
                registry=registry,
                trial_id=trial_id,
                experiment_id=experiment_id,
                hparams=hparams,
                checkpoint_gc=_gc_keys(config, storage),
                distributed=distributed,
                set_trial_state=False,  # set below, from the controller's result
            ) as core_context:
                result = TrialController(
                    trial_class,
                    core_context,
                    config,
                    trial_seed=config.experiment_seed + trial_id,
                    prune_hook=prune_hook,
                    warm_start=warm_start_source(config, registry),
                    strategy=strategy,
                ).run()
        except BaseException:
            registry.set_trial_state(trial_id, "ERROR")
            raise
        state = "PAUSED" if result.status == "preempted" else "COMPLETED"
        if chief:  # the trial's state is the chief's to record, as its checkpoints are
            registry.set_trial_state(trial_id, state)
        logger.info(
            "Trial %d (rank %d of %d) %s after %d batches: %s",
            trial_id,
            0 if distributed is None else distributed.rank,
            1 if distributed is None else distributed.size,
            result.status,
            result.batches_trained,
            result.last_validation,
        )
        return 0
    finally:
        registry.close()


def _gc_keys(config: ExperimentConfig, storage: StorageConfig) -> dict[str, Any]:
    """The trial's GC keys: the retention keys its storage carries (the route a script's
    ``core.init`` takes too), Determined's defaults filled in, ranked by the searcher metric."""
    from ckptstore.checkpointing.retention import run_retention

    gc: dict[str, Any] = run_retention(storage.retention, trial_class=True) or {}
    gc.update(metric=config.searcher.metric, smaller_is_better=config.searcher.smaller_is_better)
    return gc


def _distributed() -> tuple[DistributedContext | None, Any]:
    """``(distributed, strategy)`` of a worker whose ``TF_CONFIG`` names several workers (the
    launcher's or Ray Train's: ``slots_per_trial > 1``), else ``(None, None)``: one process,
    Keras's default strategy, as before."""
    from ckptstore.core import DistributedContext

    if trial_info.parse_tf_config(os.environ.get(trial_info.TF_CONFIG_ENV) or "{}") is None:
        return None, None
    return DistributedContext.from_tf_config()


def warm_start_source(config: ExperimentConfig, registry: Registry) -> str | None:
    """The checkpoint Determined's warm-start keys name: ``searcher.source_checkpoint_uuid``, or
    the latest checkpoint of ``searcher.source_trial_id``; None when neither is set."""
    searcher = config.searcher  # parse_config refuses both at once
    if searcher.source_trial_id is None:
        return searcher.source_checkpoint_uuid
    latest = registry.latest_checkpoint(searcher.source_trial_id)
    if latest is None:
        raise errors.InvalidConfig(
            f"searcher.source_trial_id: trial {searcher.source_trial_id} has no checkpoint in "
            f"the registry to start from. Received: {searcher.source_trial_id}. Name a trial "
            "that checkpointed, or use searcher.source_checkpoint_uuid."
        )
    return latest.uuid


def _default_registry() -> str:
    from ckptstore import defaults

    return defaults.default_registry_url()


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("CKPTSTORE_LOG_LEVEL", "INFO"),
        format="%(asctime)s trial[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = run_trial()
    except errors.CkptstoreError as exc:
        logger.error("%s: %s", type(exc).__name__, exc)
        code = 2 if isinstance(exc, errors.InvalidConfig) else 1
    sys.exit(code)


if __name__ == "__main__":
    main()
