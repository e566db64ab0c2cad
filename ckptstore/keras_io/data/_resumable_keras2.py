"""Resumable input for Keras 2's (``tf_keras``) ``fit()``: the classes of
:mod:`~ckptstore.keras_io.data._resumable`, hooked into Keras 2's ``DataHandler``.

Keras 2's fit loop (``tf_keras/src/engine/training.py``) asks its ``DataHandler`` for
``enumerate_epochs()`` -- ``(epoch, iterator)``, with ``iter(handler._dataset)`` made before the
first epoch and again for every epoch when the adapter's ``should_recreate_iterator()`` says so
-- and runs ``steps()`` on that iterator, which starts at ``handler._initial_step`` (the hook
``BackupAndRestore(save_freq=...)`` uses to skip the steps an interrupted epoch already ran;
BackupAndRestore does not skip their data, so its resumed epoch trains on the epoch's first
batches again). :func:`attach` replaces ``handler._dataset`` with an iterable whose iterator for
each epoch is built here, so that a resumed epoch reads its next unseen batch, and the callback
sets ``handler._initial_step`` at the epoch's begin so that it runs only the batches left:

=========================  ===================================================================
input given to fit()       how an epoch is reproduced
=========================  ===================================================================
NumPy/tensor arrays        as on Keras 3: a permutation drawn from ``(seed, epoch)`` (identity
                           without ``shuffle=True``; ``shuffle="batch"`` within each batch);
                           batches gathered with Keras 2's own ``slice_inputs``, its
                           sample-weight and ``class_weight`` handling reused.
keras.utils.Sequence       ``sequence[i]`` in the epoch's order, as a PyDataset on Keras 3
                           (``get_state()``/``load_state()`` saved with the checkpoint).
tf.data.Dataset            one iterator over ``dataset.repeat()`` (or the dataset itself with a
                           ``steps_per_epoch`` that is not its length), saved with
                           ``tf.train.Checkpoint``, as on Keras 3.
anything else              a warning at fit start; a preempted epoch restarts from its first
                           batch on resume: Python generators, arrays or a Sequence with
                           ``steps_per_epoch``, lists of scalars,
                           array-likes (``GenericArrayLikeDataAdapter``, e.g. h5py), sparse or
                           ragged inputs, ``DatasetCreator``, distributed datasets, datasets of
                           unknown length without ``steps_per_epoch``, several workers.
=========================  ===================================================================
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.data import _resumable as rd

logger = logging.getLogger(__name__)


def attach(
    model: KerasModel,
    *,
    seed: int,
    distributed_size: int = 1,
    on_boundary: Callable[[], None] | None = None,
) -> rd.ResumableData | None:
    """:func:`ckptstore.keras_io.data._resumable.attach` for Keras 2's ``fit()``."""
    from tf_keras.src.engine import data_adapter as da

    frame = rd.find_fit_frame(model, "data_handler")
    if frame is None:
        logger.warning(
            "Could not find the running fit() loop of Keras 2: a preempted epoch will restart "
            "from its first batch on resume."
        )
        return None
    if on_boundary is not None:
        rd.add_boundary_callback(frame, on_boundary)
    if distributed_size > 1:
        logger.warning(
            "Exact mid-epoch resume is not available with several workers yet: a preempted "
            "epoch will restart from its first batch on resume (epoch-boundary resume stays "
            "exact)."
        )
        return None
    local = frame.f_locals
    handler = local["data_handler"]
    adapter = handler._adapter
    steps_given = local.get("steps_per_epoch") not in (None, -1)
    class_weight = local.get("class_weight")
    reason = None
    if type(handler) is not da.DataHandler:
        reason = f"a {type(handler).__name__} (parameter-server training)"
    elif type(adapter) is da.TensorLikeDataAdapter:
        if steps_given:
            reason = "arrays with steps_per_epoch (an epoch is not one pass over the data)"
        else:
            inputs = _array_inputs(local.get("x"), local.get("y"), local.get("sample_weight"))
            if inputs is None:
                reason = "sparse or ragged array inputs"
            else:
                return _ArrayData(handler, adapter, inputs, class_weight, seed)
    elif isinstance(adapter, da.KerasSequenceAdapter):
        if steps_given:
            reason = "a keras.utils.Sequence with steps_per_epoch"
        else:
            return _SequenceData(handler, adapter, class_weight, seed)
    elif type(adapter) is da.DatasetAdapter and not da._is_distributed_dataset(adapter._dataset):
        data = _TFDatasetData.make(handler, adapter, class_weight)
        if data is not None:
            return data
        reason = "a tf.data.Dataset of unknown length without steps_per_epoch"
    else:
        reason = f"a {type(adapter).__name__} input (e.g. a Python generator) cannot be rewound"
    logger.warning(
        "Exact mid-epoch resume is not available on Keras 2 for %s: a preempted epoch will "
        "restart from its first batch on resume (epoch-boundary resume stays exact).",
        reason,
    )
    return None


def restore_metrics(model: KerasModel, saved: list[Any], element_spec: Any = None) -> None:
    """:func:`ckptstore.keras_io.data._resumable.restore_metrics` for Keras 2, whose compiled
    metrics are built by :func:`build_metrics`."""
    rd.restore_metrics(model, saved, element_spec, build=build_metrics)


def build_metrics(model: KerasModel, element_spec: Any) -> None:
    """Create the compiled loss/metric objects now (Keras 2 makes them in the first training
    step), tracing the model once on ``element_spec`` (nothing runs)."""
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter as da

    losses, metrics = (
        getattr(model, "compiled_loss", None),
        getattr(model, "compiled_metrics", None),
    )

    @tf.function
    def build(data: Any) -> None:
        x, y, _ = da.unpack_x_y_sample_weight(data)
        y_pred = model(x, training=False)
        if losses is not None and not losses.built:
            losses.build(y_pred)
        if metrics is not None and not metrics.built and y is not None:
            # as Keras 2's update_state does first: targets keyed by output name (a dict) to
            # the structure of the outputs (a multi-output model's list)
            metrics.build(y_pred, metrics._conform_to_outputs(y_pred, y))

    build.get_concrete_function(element_spec)


def _array_inputs(x: Any, y: Any, sample_weight: Any) -> Any:
    """What Keras 2's ``TensorLikeDataAdapter`` slices (its own steps, repeated: the adapter
    keeps no reference), or None for sparse/ragged inputs."""
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter as da
    from tf_keras.src.engine import training_utils

    x, y, sample_weight = da._process_tensorlike((x, y, sample_weight))
    modes = da.broadcast_sample_weight_modes(sample_weight, None)
    sample_weight, _, _ = training_utils.handle_partial_sample_weights(
        y, sample_weight, modes, check_all_flat=True
    )
    inputs = da.pack_x_y_sample_weight(x, y, sample_weight)
    flat = [t for t in tf.nest.flatten(inputs) if t is not None]
    if any(isinstance(t, (tf.SparseTensor, tf.RaggedTensor)) for t in flat):
        return None
    return tf.nest.map_structure(lambda t: None if t is None else tf.convert_to_tensor(t), inputs)


class _Keras2Loop:
    """Mixin over the Keras 3 classes: hooks Keras 2's ``DataHandler`` instead of Keras 3's
    epoch iterator. ``iter()`` is called before ``on_epoch_begin`` here, so the epoch being
    started is read from ``enumerate_epochs``, and the start batch from :meth:`restore`."""

    #: Whether Keras makes a new iterator each epoch (else one iterator for the whole fit).
    _recreate = True
    _epoch: int
    _start: int
    num_batches: int

    def _hook(self, handler: Any) -> Any:
        import tensorflow as tf

        self._handler = handler
        self._strategy = tf.distribute.get_strategy()  # fit() runs in its model's scope
        self._resume_at: tuple[int, int] | None = None
        original = handler._dataset
        handler._dataset = rd._EpochIterable(self, getattr(original, "element_spec", None))  # type: ignore[arg-type]
        recreate = self._recreate
        handler._adapter.should_recreate_iterator = lambda: recreate
        return original

    def _position(self) -> None:
        """Set ``_epoch``/``_start`` for the iterator Keras is making now."""
        handler, epoch = self._handler, None
        frame = sys._getframe(1)
        for _ in range(8):
            if frame is None:
                break
            if frame.f_code.co_name == "enumerate_epochs" and frame.f_locals.get("self") is handler:
                epoch = frame.f_locals.get("epoch")  # unset for the iterator made before the loop
                break
            frame = frame.f_back
        self._epoch = int(handler._initial_epoch if epoch is None else epoch)
        resume = self._resume_at
        self._start = resume[1] if resume is not None and resume[0] == self._epoch else 0

    def begin_epoch(self, epoch: int, start_batch: int) -> None:
        # Keras 2's steps() starts at _initial_step (read when the epoch's first step runs).
        self._handler._initial_step = start_batch
        self._resume_at = None

    def restore(self, state: dict[str, Any], checkpoint_dir: str) -> int:
        start = super().restore(state, checkpoint_dir)  # type: ignore[misc]
        self._resume_at = (int(state.get("epoch", -1)), start)
        return start

    def _finish(self, dataset: Any, class_weight: Any) -> Iterator[Any]:
        """Keras 2's DataHandler steps after its adapter: class weights, then distribution."""
        import tensorflow as tf
        from tf_keras.src.engine import data_adapter as da

        if class_weight:
            dataset = dataset.map(da._make_class_weight_map_fn(class_weight))
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        return iter(self._strategy.experimental_distribute_dataset(dataset))


class _ArrayData(_Keras2Loop, rd._ArrayData):
    """NumPy / tensor arrays: the Keras 3 orders, sliced by Keras 2's ``slice_inputs``."""

    def __init__(
        self, handler: Any, adapter: Any, inputs: Any, class_weight: Any, seed: int
    ) -> None:
        self._adapter = adapter
        self._inputs = inputs
        self._class_weight = class_weight
        self._seed = int(seed)
        rd._Base.__init__(self, handler, int(adapter.get_size()))

    def _epoch_iterator(self) -> Iterator[Any]:
        import tensorflow as tf

        self._position()
        adapter = self._adapter
        n = int(tf.nest.flatten(self._inputs)[0].shape[0])
        batches = self._epoch_batches(n, adapter.batch_size(), adapter._shuffle)
        indices = tf.data.Dataset.from_generator(
            lambda: iter(batches), output_signature=tf.TensorSpec([None], tf.int64)
        )
        dataset = adapter.slice_inputs(indices, self._inputs)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        return self._finish(dataset.with_options(options), self._class_weight)


class _SequenceData(_Keras2Loop, rd._PyDatasetData):
    """A ``keras.utils.Sequence``: unshuffled epochs from their first batch go through Keras
    (workers, multiprocessing); a resumed epoch and shuffled epochs are read here."""

    kind = "pydataset"

    def __init__(self, handler: Any, adapter: Any, class_weight: Any, seed: int) -> None:
        from tf_keras.src.utils import data_utils

        self._adapter = adapter
        self._class_weight = class_weight
        self._seed = int(seed)
        self._py_dataset = adapter._keras_sequence
        self._stateful = rd._stateful_dataset(self._py_dataset, data_utils.Sequence)
        rd._Base.__init__(self, handler, int(adapter.get_size()))

    def _epoch_iterator(self) -> Iterator[Any]:
        import tensorflow as tf

        self._position()
        adapter = self._adapter
        shuffle = bool(adapter._shuffle_sequence)
        if self._start == 0 and not shuffle:
            return iter(self._original)  # Keras's own reading (workers, multiprocessing)
        order = rd._epoch_order(self._seed, self._epoch, self.num_batches, shuffle)
        wanted = [int(i) for i in order[self._start :]]
        sequence = self._py_dataset

        def batches() -> Iterator[Any]:
            for i in wanted:
                yield adapter._standardize_batch(sequence[i])

        dataset = tf.data.Dataset.from_generator(
            batches, output_signature=adapter.get_dataset().element_spec
        )
        return self._finish(dataset, self._class_weight)


class _TFDatasetData(_Keras2Loop, rd._TFDatasetData):
    """A ``tf.data.Dataset``: one iterator for the whole ``fit()``, checkpointed by TF."""

    _recreate = False

    @classmethod
    def make(cls, handler: Any, adapter: Any, class_weight: Any) -> _TFDatasetData | None:  # type: ignore[override]
        from tf_keras.src.engine import data_adapter as da

        dataset = adapter._dataset
        cardinality = int(dataset.cardinality())
        steps = adapter._user_steps
        if class_weight:
            dataset = dataset.map(da._make_class_weight_map_fn(class_weight))
        if steps not in (None, -1) and steps != cardinality:
            return cls(handler, dataset, int(steps), True)
        if cardinality > 0:
            # A pass is an epoch (what Keras 2 does with a new iterator per epoch).
            return cls(handler, dataset.repeat(), cardinality, False)
        return None

    def _epoch_iterator(self) -> Iterator[Any]:
        self._position()
        return self._iter()


def build_from_fit_data(model: Any) -> None:
    """Build ``model`` from the shapes of its running ``fit()``'s data when it is not built
    yet (a ``Sequential`` without an ``Input``, a subclassed model): Keras 2 builds such a
    model in its first train step, after ``on_train_begin``, where ``DeterminedCallback``
    needs its variables (the optimizer's slots, a resume, the save layout). The same layers
    and variables that first step would make, made a step earlier. Only for Keras's own
    ``train_step``, which calls the model on ``x`` (a custom one may call it on anything
    else). Call it from a callback's ``on_train_begin``."""
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter as da

    if model.built or type(model).train_step is not rd.keras.Model.train_step:
        return
    frame = rd.find_fit_frame(model, "data_handler")
    if frame is None:
        return
    x, _, _ = da.unpack_x_y_sample_weight(frame.f_locals["data_handler"]._dataset.element_spec)
    model.build(tf.nest.map_structure(lambda spec: spec.shape, x))


__all__ = ["attach", "build_from_fit_data", "build_metrics"]
