"""The "new Keras API": ``context = ckptstore.keras.init()`` and ``context.fit(model, ...)``.

``init()`` reads the trial from the environment (or its arguments), sets up distributed training
from ``TF_CONFIG``, and returns a :class:`KerasContext`. ``context.fit()`` is ``model.fit()``
plus a ``DeterminedCallback`` that resumes from the trial's latest checkpoint, saves checkpoints
and reports metrics. The core context (registry rows, signal handlers) is opened on the first
call that needs it, so a batch-inference job that only loads and predicts creates no trial.

In a job (``ckptstore job run``, which sets ``CKPTSTORE_JOB_ID``) the context knows it does not
train: ``context.training`` raises :class:`~ckptstore.errors.NotInTraining`,
``context.config_data`` is the config's ``data:``, ``wrap_data`` shards without dropping rows,
``predict`` gathers every worker's predictions back in the original order, ``evaluate`` records
its metrics against the checkpoint the model came from (``checkpoint describe`` shows them under
``metrics.evaluations``), and ``write_output(name, array_or_dataframe)`` stores a result in the
job's folder of the storage (``jobs/<job id>/``).

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
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.core import info as trial_info
from ckptstore.keras_io._types import KerasModel

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec

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
        return trial_info.shard_batch_size(global_batch_size, self._distributed.size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._distributed, name)


# ---- data sharding -------------------------------------------------------------------------------
def _is_array_like(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def _shard_structure(obj: Any, rank: int, size: int, length: int, *, even: bool = True) -> Any:
    """Rows ``rank, rank+size, ...`` of every array in ``obj`` (array, list/tuple or dict),
    cut so every worker gets ``length // size`` rows (equal step counts on all workers) when
    ``even``; all of them otherwise (inference must not lose rows)."""
    per_worker = length // size if even else length
    if _is_array_like(obj):
        return obj[rank::size][:per_worker]
    if isinstance(obj, Mapping):
        return {k: _shard_structure(v, rank, size, length, even=even) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_shard_structure(v, rank, size, length, even=even) for v in obj)
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


def _batch_dataset_class() -> type:
    """``keras.utils.PyDataset`` (Keras 3), or ``keras.utils.Sequence`` on Keras 2."""
    from ckptstore.keras_io.backend import keras

    return getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence


def _make_sharded_pydataset(dataset: Any, rank: int, size: int) -> Any:
    base = _batch_dataset_class()

    class ShardedPyDataset(base):
        """Batches ``rank, rank+size, ...`` of another PyDataset (same count on every worker)."""

        def __init__(self) -> None:
            if base.__name__ == "Sequence":
                super().__init__()  # Keras 2's Sequence takes no arguments
            else:
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


def _encode_array(array: Any) -> dict[str, str]:
    """A NumPy array as JSON-safe text (the worker channel carries JSON), exactly."""
    import base64
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return {"npy": base64.b64encode(buffer.getvalue()).decode("ascii")}


def _decode_array(payload: Mapping[str, str]) -> Any:
    import base64
    import io

    import numpy as np

    return np.load(io.BytesIO(base64.b64decode(payload["npy"])), allow_pickle=False)


def interleave(parts: Sequence[Any]) -> Any:
    """Undo ``rank::size`` sharding: ``parts[r]`` holds rows ``r, r+size, ...`` of the whole."""
    import numpy as np

    size = len(parts)
    total = sum(len(p) for p in parts)
    first = np.asarray(parts[0])
    out = np.empty((total, *first.shape[1:]), dtype=first.dtype)
    for rank, part in enumerate(parts):
        out[rank::size] = part
    return out


def shard_data(data: Any, rank: int, size: int, *, even: bool = True) -> Any:
    """``data`` (arrays, tf.data.Dataset or PyDataset) cut to worker ``rank`` of ``size``;
    ``even=False`` keeps every row (inference): workers then get one row more or less."""
    if size <= 1:
        return data
    if type(data).__module__.startswith("tensorflow") and hasattr(data, "shard"):
        import tensorflow as tf

        options = tf.data.Options()
        # Sharded here, by worker: stop tf.distribute from sharding it a second time.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return data.shard(size, rank).with_options(options)
    if isinstance(data, _batch_dataset_class()):
        return _make_sharded_pydataset(data, rank, size)
    return _shard_structure(data, rank, size, _first_length(data), even=even)


# ---- the context ---------------------------------------------------------------------------------
class KerasContext:
    """What :func:`init` returns (see the module docstring).

    Attributes:
        training: :class:`TrainingInfo` with ``hparams``.
        config_data: the config's ``data`` section (also ``context.data``, with ``.wrap``).
        distributed: the DistributedContext, with ``trial_info.shard_batch_size(global_batch_size)``.
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
        storage: StorageSpec | None,
        registry: Registry,
        trial_id: int | None,
        experiment_id: int | None,
        checkpoint_gc: Mapping[str, Any] | None = None,
        owns_distributed: bool = True,
        job_id: int | None = None,
    ) -> None:
        self.config = config
        self.job_id = job_id
        self._training = TrainingInfo(hparams, trial_id, experiment_id)
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
    def training(self) -> TrainingInfo:
        """The trial's hyperparameters and ids; not available in a job (which does not train)."""
        if self.job_id is not None:
            raise errors.NotInTraining(
                f"context.training is not available in job {self.job_id}: a job started by "
                "`ckptstore job run` does not train. Read the job's settings from "
                "context.config_data (the config's `data:`), or train in an experiment."
            )
        return self._training

    @property
    def data(self) -> DataConfig:
        """Alias of :attr:`config_data`."""
        return self.config_data

    @property
    def distributed(self) -> Any:
        """The DistributedContext (``rank``, ``size``, ``trial_info.shard_batch_size()``, collectives)."""
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
            from ckptstore.core import init as core_init

            self._core = self._stack.enter_context(
                core_init(
                    storage=self._storage,
                    registry=self._registry,
                    trial_id=self._trial_id,
                    experiment_id=self._experiment_id,
                    hparams=self._training.hparams,
                    distributed=self._distributed,
                    close_distributed=False,
                    checkpoint_gc=self._checkpoint_gc,
                )
            )
            self._training.trial_id = self._core.info.trial.trial_id
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
        even = self.job_id is None  # a job keeps every row; predict() puts them back in order
        given = [v for v in (x, y, sample_weight) if v is not None]
        if y is None and sample_weight is not None:
            raise errors.InvalidConfig("wrap_data(x, sample_weight=...) needs y as well.")
        if len(given) == 1:
            return shard_data(x, rank, size, even=even)
        length = _first_length(x)
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None and _first_length(value) != length:
                raise errors.InvalidConfig(
                    f"wrap_data(): {name} has {_first_length(value)} rows but x has {length}; "
                    "pass arrays of the same length."
                )
        if size <= 1:
            return tuple(given)
        return tuple(_shard_structure(v, rank, size, length, even=even) for v in given)

    def wrap_optimizer(self, optimizer: Any) -> Any:
        """Check and track an optimizer; returns it. Its full state (slots, ``iterations``) is
        saved in checkpoints by the ``.keras`` file; under a ``tf.distribute`` strategy
        gradients are already aggregated across workers, so no Horovod wrapper is needed.
        On Keras 2 legacy optimizers (``tf.keras.optimizers.legacy.*``) are accepted too."""
        from ckptstore.keras_io.backend import IS_KERAS2, keras

        kinds: tuple[type, ...] = (keras.optimizers.Optimizer,)
        if IS_KERAS2:
            kinds += (keras.optimizers.legacy.Optimizer,)
        if not isinstance(optimizer, kinds):
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
        model: KerasModel,
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
        if self.job_id is not None:
            raise errors.NotInTraining(
                f"context.fit() is not available in job {self.job_id}: `ckptstore job run` "
                "starts jobs that do not train (batch inference, evaluation). Train with "
                "`ckptstore experiment create CONFIG DIR`."
            )
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
        from ckptstore.keras_io.fit._callback import DeterminedCallback

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
        history = model.fit(
            x,
            y,
            validation_data=validation_data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            callbacks=all_callbacks,
            **fit_kwargs,
        )
        # Commit the last checkpoint now: scripts like the reference's never call close(), and
        # at interpreter exit thread pools (S3/GCS/Azure uploads) no longer take new work.
        core.checkpoint.wait()
        return history

    def evaluate(self, model: KerasModel, *args: Any, **kwargs: Any) -> Any:
        """``model.evaluate()``; inside a trial, the results are also reported as validation
        metrics at the model's current step (``optimizer.iterations``). In a job, the metrics
        (averaged over the workers, weighted by their rows) are recorded against the checkpoint
        the model was loaded from by :meth:`load_checkpoint_model`."""
        if self.job_id is not None:
            # Named metrics to record; handed back in the form the caller asked for.
            wanted_dict = bool(kwargs.pop("return_dict", False))
            logs = model.evaluate(*args, return_dict=True, **kwargs)
            self._record_evaluation(model, logs, args, kwargs)
            if wanted_dict:
                return logs
            values = list(logs.values())
            return values[0] if len(values) == 1 else values
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

    def predict(self, model: KerasModel, *args: Any, **kwargs: Any) -> Any:
        """``model.predict()``. In a job with several workers, on data sharded by
        :meth:`wrap_data`, every worker gets all predictions in the original row order."""
        result = model.predict(*args, **kwargs)
        if self.job_id is None or self._distributed.size <= 1:
            return result
        import numpy as np

        if not isinstance(result, np.ndarray):
            raise errors.InvalidConfig(
                "context.predict() gathers one array per worker; this model returned a "
                f"{type(result).__name__}. Gather it yourself with context.distributed.allgather."
            )
        parts = self._distributed.allgather(_encode_array(result))
        return interleave([_decode_array(p) for p in parts])

    def _record_evaluation(
        self,
        model: KerasModel,
        logs: Mapping[str, Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        metrics = {k: float(v) for k, v in logs.items()}
        if self._distributed.size > 1:
            data = args[0] if args else kwargs.get("x")
            rows = _first_length(data) if data is not None and not hasattr(data, "shard") else 1
            everyone = self._distributed.allgather([rows, metrics])
            total = sum(n for n, _ in everyone) or 1
            metrics = {k: sum(n * m[k] for n, m in everyone) / total for k in metrics}
        uuid = getattr(model, "_ckptstore_checkpoint_uuid", None)
        if uuid is None:
            logger.warning(
                "Job %s: evaluate() on a model not loaded with context.load_checkpoint_model(); "
                "its metrics are not recorded against a checkpoint.",
                self.job_id,
            )
        elif self._distributed.rank == 0:
            import datetime as _dt

            from ckptstore.registry import open_registry

            registry = open_registry(self._registry)
            try:
                registry.add_checkpoint_evaluation(
                    uuid,
                    {
                        "job_id": self.job_id,
                        "metrics": metrics,
                        "evaluated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                    },
                )
            finally:
                if registry is not self._registry:
                    registry.close()
            logger.info("Job %s: recorded %s against checkpoint %s", self.job_id, metrics, uuid)

    def write_output(self, name: str, data: Any) -> str:
        """Write a NumPy array (``.npy``) or a pandas DataFrame (``.csv``) to the job's folder
        in the storage, ``jobs/<job id>/<name>`` (``outputs/<name>`` outside a job), on the
        chief only; returns the object's URL. Works on every storage backend.

        Example::

            predictions = context.predict(model, x)
            context.write_output("predictions.npy", predictions)
        """
        import io

        import numpy as np

        from ckptstore.storage_backends.spec import resolve

        if hasattr(data, "to_csv"):
            payload = data.to_csv(index=False).encode()
        else:
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(data), allow_pickle=False)
            payload = buffer.getvalue()
        folder = f"jobs/{self.job_id}" if self.job_id is not None else "outputs"
        key = f"{folder}/{name}"
        config = resolve(self._storage or None)
        store = config.open()
        try:
            url = f"{store.url.rstrip('/')}/{key}"
            if self._distributed.rank == 0:
                store.write_bytes(key, payload)
                logger.info("Wrote %d bytes to %s", len(payload), url)
            return url
        finally:
            if config.instance is None:
                store.close()

    def load_checkpoint_model(
        self, trial_id: int | None = None, checkpoint_uuid: str | None = None, **kwargs: Any
    ) -> Any:
        """Load the model of a trial's latest (or ``best_by``) checkpoint, or of one UUID, from
        this context's storage and registry (see ``ckptstore.load_checkpoint_model``)."""
        from ckptstore.keras_io.loading._loaders import load_checkpoint_model

        if self._core is not None:  # checkpoints still being committed (exported) here count
            self._core.checkpoint.wait()
        kwargs.setdefault("storage", self._storage)
        kwargs.setdefault("registry", self._registry)
        model = load_checkpoint_model(trial_id=trial_id, checkpoint_uuid=checkpoint_uuid, **kwargs)
        uuid = getattr(model, "_ckptstore_checkpoint_uuid", None)
        if self.job_id is not None and uuid and self._distributed.rank == 0:
            self._record_job_checkpoint(uuid)
        return model

    def _record_job_checkpoint(self, uuid: str) -> None:
        """``job describe`` names the checkpoint(s) a job loaded (never fails the job)."""
        from ckptstore.registry import open_registry

        try:
            registry = open_registry(self._registry)
            try:
                registry.add_job_checkpoint(self.job_id, uuid)
            finally:
                if registry is not self._registry:
                    registry.close()
        except errors.CkptstoreError as exc:
            logger.warning("Job %s: could not record that it loaded %s: %s", self.job_id, uuid, exc)
        logger.info("Job %s loaded checkpoint %s", self.job_id, uuid)

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
            f"KerasContext(trial_id={self._training.trial_id}, job_id={self.job_id}, "
            f"rank={self._distributed.rank}/"
            f"{self._distributed.size})"
        )


def init(
    hparams: Mapping[str, Any] | None = None,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
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
        storage: as for ``ckptstore.core.init`` (env ``CKPTSTORE_STORAGE``).
        registry: as for ``ckptstore.core.init`` (env ``CKPTSTORE_REGISTRY``).
        trial_id: as for ``ckptstore.core.init`` (env ``CKPTSTORE_TRIAL_ID``).
        experiment_id: as for ``ckptstore.core.init``.
        distributed: a DistributedContext; default ``DistributedContext.from_tf_config()``
            (which also picks the strategy, exposed as ``context.strategy``).
        config: an experiment-config-like dict: ``data`` (-> ``context.config_data``; default
            ``CKPTSTORE_DATA_CONFIG``), ``hyperparameters``, ``searcher.max_length.epochs``,
            ``reproducibility.experiment_seed`` (seeds Python, NumPy and TensorFlow).

    Example::

        context = ckptstore.keras.init({"lr": 0.1}, storage="s3://bucket/ckpts")
    """
    import tensorflow as tf

    from ckptstore.keras_io.backend import keras

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
    job_id = trial_info.parse_int_env(trial_info.JOB_ID_ENV)

    seed = (config.get("reproducibility") or {}).get("experiment_seed")
    if seed is not None:
        keras.utils.set_random_seed(int(seed) + int(trial_id or 0))

    owns_distributed = distributed is None
    if distributed is None:
        from ckptstore.core import DistributedContext

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
        job_id=job_id,
    )


__all__ = ["DataConfig", "KerasContext", "TrainingInfo", "init", "interleave", "shard_data"]
