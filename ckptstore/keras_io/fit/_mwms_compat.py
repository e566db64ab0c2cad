"""Makes Keras 3's ``model.fit()`` work under ``tf.distribute.MultiWorkerMirroredStrategy``.

Keras 3 cannot run ``fit()``/``evaluate()`` with a ``MultiWorkerMirroredStrategy`` that spans
several worker processes (reported since Keras 3.0 / TensorFlow 2.16 in keras-team/keras#20585
and tensorflow/tensorflow#72388; reproduced with Keras 3.15 / TensorFlow 2.21). Two places in
``keras/src/backend/tensorflow/trainer.py`` break, both only in multi-worker mode:

1. ``TensorFlowTrainer._maybe_symbolic_build`` calls ``strategy.reduce("MEAN", batch,
   axis=None)`` on the whole first batch (a tuple of ``PerReplica``) just to learn its shapes.
   ``Strategy.reduce`` does not take nests, and the collective path tries to turn the tuple
   into a tensor: ``ValueError: Attempt to convert a value (PerReplica:...) ... to a Tensor``.
   The fix takes this worker's first local replica batch instead (only shapes matter there).
2. ``reduce_per_replica`` reduces every training/evaluation log value (loss, metrics: scalars)
   with ``strategy.reduce("MEAN", v, axis=0)``: ``Invalid reduction dimension 0 for input with
   0 dimensions``. The fix reduces scalars with ``axis=None`` (a cross-worker mean) and leaves
   everything else to Keras.

:func:`apply_mwms_compat` installs both fixes once per process. Nothing else changes: outside
multi-worker mode (no strategy, ``MirroredStrategy``, one worker) Keras's own code runs, and the
replaced functions call Keras's originals. Gradients were always aggregated correctly by
Keras; two workers with the fixes train to the same weights and logs as one process on the
global batch. :class:`~ckptstore.keras_io.fit._callback.DeterminedCallback` applies the fixes itself
when its core context has several workers, so ``model.fit(..., callbacks=[det_cb])`` works as
documented; so does the TFKerasTrial controller of a trial on several slots (its
``train_on_batch`` logs and ``evaluate()`` go through the same two functions). Set ``CKPTSTORE_MWMS_COMPAT=0`` to leave Keras untouched.

Example::

    from ckptstore.keras_io.fit._mwms_compat import apply_mwms_compat

    apply_mwms_compat()  # before model.fit() under MultiWorkerMirroredStrategy
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: Environment variable; ``0``/``false``/``no``/``off`` disables :func:`apply_mwms_compat`.
ENV_DISABLE = "CKPTSTORE_MWMS_COMPAT"
#: Keras major versions whose TensorFlow trainer has the two defects handled here.
_KERAS_MAJOR = 3
_MARK = "_ckptstore_mwms_compat"

_applied = False


def apply_mwms_compat() -> bool:
    """Install the two multi-worker fixes into Keras's TensorFlow trainer (idempotent).

    Returns True when the fixes are in place after the call, False when they were not
    installed: another Keras backend than TensorFlow, another Keras major version, a trainer
    without the expected functions (a Keras that changed them: the fixes are then not needed
    or no longer fit), or ``CKPTSTORE_MWMS_COMPAT=0``.

    Example::

        apply_mwms_compat()
        with strategy.scope():
            model = build_and_compile()
        model.fit(dataset, epochs=3)
    """
    global _applied
    if _applied:
        return True
    if os.environ.get(ENV_DISABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.info("%s is off: Keras's multi-worker fit() is left unpatched", ENV_DISABLE)
        return False
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    major = _major(getattr(keras, "__version__", ""))
    if major != _KERAS_MAJOR:
        logger.info("Keras %s: multi-worker compatibility fixes not applied", keras.__version__)
        return False
    try:
        from keras.src.backend.tensorflow import trainer as tf_trainer
    except ImportError:  # pragma: no cover - layout of keras 3 changed
        logger.warning("keras.src.backend.tensorflow.trainer not found: fixes not applied")
        return False
    needed = (
        callable(getattr(tf_trainer, "reduce_per_replica", None))
        and callable(getattr(tf_trainer, "_collective_all_reduce_multi_worker", None))
        and callable(getattr(tf_trainer.TensorFlowTrainer, "_maybe_symbolic_build", None))
    )
    if not needed:
        logger.warning(
            "Keras %s's TensorFlow trainer has no reduce_per_replica/_maybe_symbolic_build: "
            "multi-worker compatibility fixes not applied",
            keras.__version__,
        )
        return False
    if not getattr(tf_trainer.reduce_per_replica, _MARK, False):
        tf_trainer.reduce_per_replica = _wrap_reduce(tf_trainer)
    build = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    if not getattr(build, _MARK, False):
        tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _wrap_build(tf_trainer, build)
    _applied = True
    logger.debug("Keras %s: MultiWorkerMirroredStrategy fixes applied", keras.__version__)
    return True


def _major(version: str) -> int | None:
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return None


def _wrap_build(tf_trainer: Any, original: Any) -> Any:
    """``_maybe_symbolic_build`` that builds from this worker's first local replica batch."""
    import tensorflow as tf
    from keras.src import tree

    def local_value(value: Any, strategy: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = getattr(self, "_distribute_strategy", None)
        if (
            strategy is None
            or iterator is None
            or not tf_trainer._collective_all_reduce_multi_worker(strategy)
        ):
            return original(self, iterator=iterator, data_batch=data_batch)
        for _, _, batches in iterator:  # the same first batch Keras itself would look at
            batch = next(batches)
            data_batch = tree.map_structure(lambda v: local_value(v, strategy), batch)
            break
        return original(self, iterator=None, data_batch=data_batch)

    setattr(_maybe_symbolic_build, _MARK, True)
    return _maybe_symbolic_build


def _wrap_reduce(tf_trainer: Any) -> Any:
    """``reduce_per_replica`` that averages scalar logs across workers with ``axis=None``."""
    import tensorflow as tf
    from keras.src import tree

    original = tf_trainer.reduce_per_replica

    def rank(value: Any) -> int | None:
        if isinstance(value, tf.distribute.DistributedValues):
            value = value.values[0]
        shape = getattr(value, "shape", None)
        return getattr(shape, "rank", None)

    @functools.wraps(original)
    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction not in ("auto", "mean") or not tf_trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return original(values, strategy, reduction)

        def reduce_one(value: Any) -> Any:
            if rank(value) == 0:
                return strategy.reduce("MEAN", value, axis=None)
            return original(value, strategy, reduction)

        return tree.map_structure(reduce_one, values)

    setattr(reduce_per_replica, _MARK, True)
    return reduce_per_replica


def keras2_worker_batch_step(
    model: Any, strategy: Any, x: Any, y: Any, sample_weight: Any, class_weight: Any
) -> dict[str, Any]:
    """Keras 2's ``train_on_batch`` on the batch *this worker* holds, under a multi-worker
    strategy.

    Keras 2's ``train_on_batch`` hands its batch to ``strategy.experimental_distribute_dataset``,
    which takes the batch as the *global* one: it splits it in per-replica parts and each worker
    keeps only its part, so two workers would each train on half of their own batch (a global
    batch of half the size, not what one worker on the same data computes). A TFKerasTrial
    worker's batch is already its share of the global batch (``get_per_slot_batch_size``), so
    this goes through ``distribute_datasets_from_function``, which neither shards nor rebatches,
    into the model's own train function, as ``train_on_batch(reset_metrics=True,
    return_dict=True)`` does."""
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter
    from tf_keras.src.utils import tf_utils

    x, y, sample_weight = data_adapter._process_tensorlike((x, y, sample_weight))
    data = (x,) if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)

    def per_worker(_: Any) -> Any:
        dataset = tf.data.Dataset.from_tensors(data)
        if class_weight:
            dataset = dataset.map(data_adapter._make_class_weight_map_fn(class_weight))
        return dataset

    model.reset_metrics()
    with strategy.scope():
        iterator = iter(strategy.distribute_datasets_from_function(per_worker))
        model.train_function = model.make_train_function()
        logs = model.train_function(iterator)
    return tf_utils.sync_to_numpy_or_python_type(logs)
