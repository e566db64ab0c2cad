"""The "new Keras API": ``context = ckptstore.keras.init()`` and ``context.fit(model, ...)``.

``init()`` reads the trial from the environment (or its arguments), sets up distributed training
from ``TF_CONFIG``, and returns a :class:`KerasContext`. ``context.fit()`` is ``model.fit()``
plus a ``DeterminedCallback`` that resumes from the trial's latest checkpoint, saves checkpoints
and reports metrics. The core context (registry rows, signal handlers) is opened on the first
call that needs it, so a batch-inference job that only loads and predicts creates no trial.

Example::

    import ckptstore as det

    context = det.keras.init(hparams={"lr": 0.01}, storage="/tmp/ckpts", trial_id=1)
    x, y = context.wrap_data(x, y)
    with context.strategy.scope():
        model = build_model()
        model.compile(optimizer=context.wrap_optimizer(keras.optimizers.Adam(0.01)), loss="mse")
    context.fit(model, x=x, y=y, validation_data=(xv, yv), epochs=4,
                batch_size=context.distributed.shard_batch_size(64))
    context.close()
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.keras_io import trial_info
from ckptstore.keras_io.distributed import shard_batch_size

logger = logging.getLogger(__name__)


class TrainingInfo:
    """``context.training``: the trial's hyperparameters (and ids when in a trial)."""

    def __init__(
        self, hparams: dict[str, Any], trial_id: int | None, experiment_id: int | None
    ) -> None:
        self.hparams = hparams
        self.trial_id = trial_id
        self.experiment_id = experiment_id

    def __repr__(self) -> str:
        return f"TrainingInfo(trial_id={self.trial_id}, hparams={self.hparams!r})"


class DataConfig(dict):
    """``context.config_data`` / ``context.data``: the config's ``data`` section (a dict), whose
    ``wrap(...)`` is :meth:`KerasContext.wrap_data` (the reference uses both spellings)."""

    def __init__(self, values: Mapping[str, Any], context: KerasContext) -> None:
        super().__init__(values)
        self._context = context

    def wrap(self, *args: Any, **kwargs: Any) -> Any:
        """Same as ``context.wrap_data(...)``."""
        return self._context.wrap_data(*args, **kwargs)


class _DistributedView:
    """Adds ``shard_batch_size`` to a DistributedContext that lacks it."""

    def __init__(self, distributed: Any) -> None:
        self._distributed = distributed

    def shard_batch_size(self, global_batch_size: int) -> int:
        return shard_batch_size(global_batch_size, self._distributed.size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._distributed, name)


# ---- data sharding -------------------------------------------------------------------------------
def _is_array_like(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def _shard_structure(obj: Any, rank: int, size: int, length: int) -> Any:
    """Rows ``rank, rank+size, ...`` of every array in ``obj`` (array, list/tuple or dict),
    cut so every worker gets ``length // size`` rows (equal step counts on all workers)."""
    per_worker = length // size
    if _is_array_like(obj):
        return obj[rank::size][:per_worker]
    if isinstance(obj, Mapping):
        return {k: _shard_structure(v, rank, size, length) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_shard_structure(v, rank, size, length) for v in obj)
    raise errors.InvalidConfig(
        "wrap_data() takes NumPy arrays (or lists/dicts of them), a tf.data.Dataset or a "
        f"keras.utils.PyDataset. Received: {type(obj).__name__}."
    )


def _first_length(obj: Any) -> int:
    if _is_array_like(obj):
        return len(obj)
    if isinstance(obj, Mapping) and obj:
        return _first_length(next(iter(obj.values())))
    if isinstance(obj, (list, tuple)) and obj:
        return _first_length(obj[0])
    raise errors.InvalidConfig(
        "wrap_data() takes NumPy arrays (or lists/dicts of them), a tf.data.Dataset or a "
        f"keras.utils.PyDataset. Received: {type(obj).__name__}."
    )


def _make_sharded_pydataset(dataset: Any, rank: int, size: int) -> Any:
    import keras

    class ShardedPyDataset(keras.utils.PyDataset):
        """Batches ``rank, rank+size, ...`` of another PyDataset (same count on every worker)."""

        def __init__(self) -> None:
            super().__init__(
                workers=getattr(dataset, "workers", 1),
                use_multiprocessing=getattr(dataset, "use_multiprocessing", False),
                max_queue_size=getattr(dataset, "max_queue_size", 10),
            )
            self.inner = dataset

        def __len__(self) -> int:
            return len(self.inner) // size

        def __getitem__(self, index: int) -> Any:
            return self.inner[index * size + rank]

        def on_epoch_end(self) -> None:
            self.inner.on_epoch_end()

    return ShardedPyDataset()


def shard_data(data: Any, rank: int, size: int) -> Any:
    """``data`` (arrays, tf.data.Dataset or PyDataset) cut to worker ``rank`` of ``size``."""
    if size <= 1:
        return data
    if type(data).__module__.startswith("tensorflow") and hasattr(data, "shard"):
        import tensorflow as tf

        options = tf.data.Options()
        # Sharded here, by worker: stop tf.distribute from sharding it a second time.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return data.shard(size, rank).with_options(options)
    import keras

    if isinstance(data, keras.utils.PyDataset):
        return _make_sharded_pydataset(data, rank, size)
    return _shard_structure(data, rank, size, _first_length(data))


# ---- the context ---------------------------------------------------------------------------------
class KerasContext:
    """What :func:`init` returns (see the module docstring).

    Attributes:
        training: :class:`TrainingInfo` with ``hparams``.
        config_data: the config's ``data`` section (also ``context.data``, with ``.wrap``).
        distributed: the DistributedContext, with ``shard_batch_size(global_batch_size)``.
        strategy: the ``tf.distribute.Strategy`` to build and compile models under.

    Example::

        context = ckptstore.keras.init()
        hist = context.fit(model, x=x, y=y, validation_data=(xv, yv), epochs=3)
    """

    def __init__(
        self,
        *,
        hparams: dict[str, Any],
        config: dict[str, Any],
        data_config: dict[str, Any],
        distributed: Any,
        strategy: Any,
        storage: Any,
        registry: Any,
        trial_id: int | None,
        experiment_id: int | None,
        checkpoint_gc: Mapping[str, Any] | None = None,
        owns_distributed: bool = True,
    ) -> None:
        self.config = config
        self.training = TrainingInfo(hparams, trial_id, experiment_id)
        self.config_data = DataConfig(data_config, self)
        self._distributed = distributed
        self.strategy = strategy
        self._storage = storage
        self._registry = registry
        self._trial_id = trial_id
        self._experiment_id = experiment_id
        self._checkpoint_gc = checkpoint_gc
        self._owns_distributed = owns_distributed
        self._stack = contextlib.ExitStack()
        self._core: Any = None
        self._optimizers: list[Any] = []
        self._closed = False
        atexit.register(self.close)

    # ---- properties ---------------------------------------------------------------------------
    @property
    def data(self) -> DataConfig:
        """Alias of :attr:`config_data`."""
        return self.config_data

    @property
    def distributed(self) -> Any:
        """The DistributedContext (``rank``, ``size``, ``shard_batch_size()``, collectives)."""
        if hasattr(self._distributed, "shard_batch_size"):
            return self._distributed
        return _DistributedView(self._distributed)

    @property
    def core(self) -> Any:
        """The core context (``ckptstore.core.Context``), opened on first use."""
        if self._closed:
            raise errors.InvalidConfig(
                "This Keras context was closed; call ckptstore.keras.init() again."
            )
        if self._core is None:
            from ckptstore.keras_io.core_context import init as core_init

            self._core = self._stack.enter_context(
                core_init(
                    storage=self._storage,
                    registry=self._registry,
                    trial_id=self._trial_id,
                    experiment_id=self._experiment_id,
                    hparams=self.training.hparams,
                    distributed=self._distributed,
                    close_distributed=False,
                    checkpoint_gc=self._checkpoint_gc,
                )
            )
            self.training.trial_id = self._core.info.trial.trial_id
        return self._core

    # ---- wrappers -----------------------------------------------------------------------------
    def wrap_data(
        self, x: Any, y: Any = None, sample_weight: Any = None, *, shard: bool = True
    ) -> Any:
        """Shard data for this worker; returns ``x``, ``(x, y)`` or ``(x, y, sample_weight)``
        as given. NumPy arrays (or lists/dicts of them) keep rows ``rank::size``, cut to the
        same length on every worker; a ``tf.data.Dataset`` uses ``Dataset.shard`` (wrap it as
        early as possible); a ``keras.utils.PyDataset`` keeps batches ``rank::size``. With one
        worker, or ``shard=False``, the data is returned unchanged."""
        rank = self._distributed.rank
        size = self._distributed.size if shard else 1
        given = [v for v in (x, y, sample_weight) if v is not None]
        if y is None and sample_weight is not None:
            raise errors.InvalidConfig("wrap_data(x, sample_weight=...) needs y as well.")
        if len(given) == 1:
            return shard_data(x, rank, size)
        length = _first_length(x)
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None and _first_length(value) != length:
                raise errors.InvalidConfig(
                    f"wrap_data(): {name} has {_first_length(value)} rows but x has {length}; "
                    "pass arrays of the same length."
                )
        if size <= 1:
            return tuple(given)
        return tuple(_shard_structure(v, rank, size, length) for v in given)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Check and track an optimizer; returns it. Its full state (slots, ``iterations``) is
        saved in checkpoints by the ``.keras`` file; under a ``tf.distribute`` strategy
        gradients are already aggregated across workers, so no Horovod wrapper is needed."""
        import keras

        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise errors.InvalidConfig(
                "wrap_optimizer() takes a keras.optimizers.Optimizer. "
                f"Received: {type(optimizer).__name__}."
            )
        self._optimizers.append(optimizer)
        return optimizer

    # ---- training -----------------------------------------------------------------------------
    def _default_epochs(self) -> int | None:
        searcher = self.config.get("searcher") or {}
        max_length = searcher.get("max_length") if isinstance(searcher, Mapping) else None
        if isinstance(max_length, Mapping) and "epochs" in max_length:
            return int(max_length["epochs"])
        return None

    def fit(
        self,
        model: Any,
        x: Any = None,
        y: Any = None,
        *,
        validation_data: Any = None,
        validation_split: float = 0.0,
        x_val: Any = None,
        y_val: Any = None,
        epochs: int | None = None,
        initial_epoch: int = 0,
        callbacks: Sequence[Any] | None = None,
        checkpoint_epochs: int = 1,
        train_metrics_report_period: Any = "epoch",
        **fit_kwargs: Any,
    ) -> Any:
        """``model.fit()`` with checkpoints, resume and metrics.

        Validation data is required (``validation_data``, ``validation_split`` or
        ``x_val``/``y_val``). A ``DeterminedCallback`` is added with the trial's latest
        checkpoint and ``continue_id`` = the trial id, so a re-run resumes at the epoch the
        last run reached (``initial_epoch`` is then set by the callback). ``epochs`` defaults to
        the config's ``searcher.max_length.epochs``, else 1.
        """
        if x_val is not None or y_val is not None:
            if validation_data is not None:
                raise errors.InvalidConfig("Pass validation_data= or x_val=/y_val=, not both.")
            validation_data = (x_val, y_val) if y_val is not None else x_val
        if validation_data is None and not validation_split:
            raise errors.InvalidConfig(
                "context.fit() needs validation data: pass validation_data=(x_val, y_val), "
                "x_val=/y_val= or validation_split=0.1."
            )
        if epochs is None:
            epochs = self._default_epochs() or 1
        from ckptstore.keras_io.callback import DeterminedCallback

        core = self.core
        det_cb = DeterminedCallback(
            core,
            checkpoint=core.info.latest_checkpoint,
            continue_id=core.info.trial.trial_id,
            checkpoint_epochs=checkpoint_epochs,
            train_metrics_report_period=train_metrics_report_period,
        )
        all_callbacks = [*(callbacks or []), det_cb]
        if validation_split:
            fit_kwargs["validation_split"] = validation_split
        return model.fit(
            x,
            y,
            validation_data=validation_data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            callbacks=all_callbacks,
            **fit_kwargs,
        )

    def evaluate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate()``; inside a trial, the results are also reported as validation
        metrics at the model's current step (``optimizer.iterations``)."""
        result = model.evaluate(*args, **kwargs)
        if self._in_trial():
            metrics = result if isinstance(result, Mapping) else None
            if metrics is None:
                values = result if isinstance(result, (list, tuple)) else [result]
                metrics = dict(zip(model.metrics_names, values, strict=False))
            optimizer = getattr(model, "optimizer", None)
            steps = int(optimizer.iterations.numpy()) if optimizer is not None else 0
            self.core.train.report_validation_metrics(steps, metrics)
        return result

    def predict(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.predict()``."""
        return model.predict(*args, **kwargs)

    def load_checkpoint_model(
        self, trial_id: int | None = None, checkpoint_uuid: str | None = None, **kwargs: Any
    ) -> Any:
        """Load the model of a trial's latest (or ``best_by``) checkpoint, or of one UUID, from
        this context's storage and registry (see ``ckptstore.load_checkpoint_model``)."""
        from ckptstore.keras_io.loaders import load_checkpoint_model

        kwargs.setdefault("storage", self._storage)
        kwargs.setdefault("registry", self._registry)
        return load_checkpoint_model(trial_id=trial_id, checkpoint_uuid=checkpoint_uuid, **kwargs)

    def _in_trial(self) -> bool:
        return self._core is not None or self._trial_id is not None

    def close(self) -> None:
        """Wait for background uploads and release the core context and distributed channel.
        Idempotent; also run at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._stack.close()
        finally:
            if self._owns_distributed:
                with contextlib.suppress(Exception):
                    self._distributed.close()

    def __enter__(self) -> KerasContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"KerasContext(trial_id={self.training.trial_id}, rank={self._distributed.rank}/"
            f"{self._distributed.size})"
        )


def init(
    hparams: Mapping[str, Any] | None = None,
    *,
    storage: Any = None,
    registry: Any = None,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    distributed: Any = None,
    config: Mapping[str, Any] | None = None,
    checkpoint_gc: Mapping[str, Any] | None = None,
) -> KerasContext:
    """Create the Keras context (see the module docstring).

    Args:
        hparams: hyperparameters; default ``CKPTSTORE_HPARAMS``, else the config's
            ``hyperparameters``, else ``{}``.
        storage, registry, trial_id, experiment_id: as for ``ckptstore.core.init`` (env vars
            ``CKPTSTORE_STORAGE``, ``CKPTSTORE_REGISTRY``, ``CKPTSTORE_TRIAL_ID``, ...).
        distributed: a DistributedContext; default ``DistributedContext.from_tf_config()``
            (which also picks the strategy, exposed as ``context.strategy``).
        config: an experiment-config-like dict: ``data`` (-> ``context.config_data``; default
            ``CKPTSTORE_DATA_CONFIG``), ``hyperparameters``, ``searcher.max_length.epochs``,
            ``reproducibility.experiment_seed`` (seeds Python, NumPy and TensorFlow).

    Example::

        context = ckptstore.keras.init({"lr": 0.1}, storage="s3://bucket/ckpts")
    """
    import keras
    import tensorflow as tf

    config = dict(config or {})
    if config and not isinstance(config.get("data", {}), Mapping):
        raise errors.InvalidConfig(
            f"config['data'] must be a dict. Received: {type(config['data']).__name__}."
        )
    if hparams is None:
        hparams = trial_info.parse_json_env(trial_info.HPARAMS_ENV)
    if hparams is None:
        hparams = config.get("hyperparameters") or {}
    data_config = config.get("data")
    if data_config is None:
        data_config = trial_info.parse_json_env(trial_info.DATA_CONFIG_ENV) or {}
    if trial_id is None:
        trial_id = trial_info.parse_int_env(trial_info.TRIAL_ID_ENV)
    if experiment_id is None:
        experiment_id = trial_info.parse_int_env(trial_info.EXPERIMENT_ID_ENV)

    seed = (config.get("reproducibility") or {}).get("experiment_seed")
    if seed is not None:
        keras.utils.set_random_seed(int(seed) + int(trial_id or 0))

    owns_distributed = distributed is None
    if distributed is None:
        from ckptstore.keras_io.distributed import DistributedContext

        distributed, strategy = DistributedContext.from_tf_config()
    else:
        strategy = tf.distribute.get_strategy()
    return KerasContext(
        hparams=dict(hparams),
        config=config,
        data_config=dict(data_config),
        distributed=distributed,
        strategy=strategy,
        storage=storage,
        registry=registry,
        trial_id=trial_id,
        experiment_id=experiment_id,
        checkpoint_gc=checkpoint_gc,
        owns_distributed=owns_distributed,
    )


__all__ = ["DataConfig", "KerasContext", "TrainingInfo", "init", "shard_data"]
