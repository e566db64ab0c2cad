"""Resumable input for Keras 3's ``fit()``: continue a preempted epoch at its next unseen batch.

Keras's fit loop (``keras/src/backend/tensorflow/trainer.py``) builds a ``TFEpochIterator``
around a data adapter, makes a fresh iterator of its dataset every epoch and runs
``num_batches`` steps on it. It cannot start an epoch at a batch offset. :func:`attach`, called
by :class:`~ckptstore.keras_io.fit._callback.DeterminedCallback` in ``on_train_begin``,
finds that epoch iterator and gives it an iterable whose iterator for each epoch is one this
module controls, so that the epoch's data order depends only on checkpointed state and a
resumed epoch starts at batch ``k`` without reading or training on batches ``0..k-1``:

=====================  =========================================================================
input given to fit()   how an epoch is reproduced
=====================  =========================================================================
NumPy/tensor arrays    batches of a permutation drawn from ``(seed, epoch)`` with TF's stateless
                       shuffle (identity without ``shuffle=True``; ``shuffle="batch"`` shuffles
                       within each batch the same way); the seed is saved in the checkpoint.
                       Keras's ``class_weight``/``sample_weight`` handling is reused.
PyDataset / Sequence   ``py_dataset[i]`` for ``i`` in the epoch's order (as above); a PyDataset
                       that reorders itself in ``on_epoch_end`` keeps that order across a resume
                       only if it has ``get_state()``/``load_state()`` (saved with the checkpoint).
                       Keras's workers read only the epochs Keras reads itself.
tf.data.Dataset        one iterator over ``dataset.repeat()`` for the whole fit (or over the
                       dataset itself when ``steps_per_epoch`` is given), snapshotted with
                       ``tf.train.Checkpoint`` (TF's own iterator checkpointing: shuffle buffers,
                       shuffle seeds, position) -- exact whenever TF can checkpoint the pipeline
                       (a map with a stateful op: checkpoints without the position, a warning).
                       Without ``steps_per_epoch``, when ``steps_per_execution`` does not divide a
                       pass: each epoch's batches through a Python iterator ending with the pass
                       (:meth:`_TFDatasetData.end_epochs_with_passes`).
torch DataLoader       one iterator per epoch, a resumed one made from the generator states
                       its epoch began with (:mod:`~ckptstore.keras_io.data._resumable_torch`)
Python generator, ...  cannot be rewound: a warning at fit start, and a preempted epoch restarts
                       from its first batch on resume.
=====================  =========================================================================

Keras 3 with the TensorFlow backend is handled here; on the JAX backend the same classes are
hooked into the JAX epoch iterator by :mod:`~ckptstore.keras_io.data._resumable_jax` (through
:mod:`~ckptstore.keras_io.data._resumable_torch`); Keras 2
(``tf_keras``) has the same classes hooked into its
``DataHandler`` in :mod:`~ckptstore.keras_io.data._resumable_keras2`. Anything else gets
:data:`None` from :func:`attach` and the epoch-restart behaviour.

Example (what DeterminedCallback does)::

    data = attach(model)                       # in on_train_begin, inside fit()
    data.begin_epoch(epoch, start_batch=0)     # in on_epoch_begin
    state = data.snapshot(epoch, batches_done, checkpoint_dir)   # at a preemption
    start = data.restore(state, checkpoint_dir)                  # in the resumed run
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from ckptstore.keras_io import _tf_logging as tf_logging
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.backend import keras
from ckptstore.keras_io.data import _tfdata_state as tfdata_state

logger = logging.getLogger(__name__)

#: Folder of the tf.data iterator checkpoint inside a checkpoint.
ITERATOR_DIRNAME = "data_iterator"
_ITERATOR_PREFIX = "iterator"


class ResumableData(Protocol):
    """The per-fit handle :func:`attach` returns."""

    kind: str
    num_batches: int
    element_spec: Any

    def begin_epoch(self, epoch: int, start_batch: int) -> None: ...

    def snapshot(self, epoch: int, batches_done: int, checkpoint_dir: str) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any], checkpoint_dir: str) -> int: ...


def find_fit_frame(model: KerasModel, loop_name: str = "epoch_iterator") -> Any:
    """The frame of the running ``model.fit()`` (Keras gives callbacks no handle on its loop):
    the one whose local ``loop_name`` (``epoch_iterator`` in Keras 3, ``data_handler`` in
    Keras 2) holds the fit loop."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        if (
            frame.f_code.co_name == "fit"
            and frame.f_locals.get("self") is model
            and loop_name in frame.f_locals
        ):
            return frame
        frame = frame.f_back
    return None


def epoch_ends_with_data(model: KerasModel) -> bool:
    """Whether the running Keras 3 ``fit()`` of ``model`` ends each epoch with its data (no
    ``steps_per_epoch``): an epoch's last execution of ``steps_per_execution`` batches is then
    cut short by the data's end, which Keras still reports as a full one. With
    ``steps_per_epoch`` (and on Keras 2, which shortens the execution itself) the batches
    reported are the batches trained. Call it from a callback's ``on_train_begin``."""
    frame = find_fit_frame(model)
    epoch_iterator = frame.f_locals["epoch_iterator"] if frame is not None else None
    return epoch_iterator is not None and not epoch_iterator.steps_per_epoch


def build_from_fit_data(model: KerasModel) -> None:
    """Build ``model`` from the element spec of its running ``fit()``'s data when a layer of
    it is not built yet (a ``Sequential`` without an ``Input``, a subclassed model). Keras 3's
    TensorFlow loop builds such a model when it traces the first train step, after
    ``on_train_begin``, where ``DeterminedCallback`` needs its variables (an optimizer built
    before them knows none of them: ``Unknown variable`` at the first step). Keras's own
    symbolic build (what its JAX and PyTorch loops run before the callbacks start) makes the
    same variables from the spec, reading no data. Only for Keras's own ``train_step``, which
    calls the model on ``x``: a custom one may call it on anything else (a GAN's latent
    vectors) or never. Call it from ``on_train_begin``."""
    if type(model).train_step is not keras.Model.train_step:
        return
    if all(layer.built for layer in model._flatten_layers()):
        return
    frame = find_fit_frame(model)
    dataset = getattr(frame and frame.f_locals["epoch_iterator"], "_distributed_dataset", None)
    if dataset is not None:
        model._symbolic_build(data_batch=dataset.element_spec)


def default_seed() -> int:
    """A seed for the data order that follows the user's seeding (``keras.utils.set_random_seed``
    / ``np.random.seed``) without drawing from any generator."""
    keys = np.random.get_state()[1]
    return int(zlib.crc32(np.asarray(keys[:8], dtype=np.uint32).tobytes()))


def attach(
    model: KerasModel,
    *,
    seed: int,
    distributed_size: int = 1,
    on_boundary: Callable[[], None] | None = None,
    adapt: Callable[[Any, int], tuple[Any, str | None]] | None = None,
) -> ResumableData | None:
    """Take over the epoch iteration of the running ``fit()`` of ``model``.

    Returns None (after one warning saying what happens instead) when the input cannot be
    resumed mid-epoch exactly. ``seed`` orders shuffled arrays/PyDatasets (saved in every
    checkpoint, so a resumed run gets the same orders). ``on_boundary`` is called first thing
    at every epoch end, validation begin and train end -- once every callback has finished
    the last batch and before any of them reacts to the end of the epoch -- and at every
    train batch begin. ``adapt`` (the JAX loop's, a torch DataLoader's) makes the handle for
    the fit's epoch iterator instead of this module's :func:`_adapt`.
    """
    on_backend = keras.backend.backend() in ("tensorflow", "jax", "torch")
    frame = find_fit_frame(model) if on_backend else None
    if frame is None:
        logger.warning(
            "Could not find the running fit() loop (not Keras 3's TensorFlow, JAX or PyTorch "
            "trainer?): a "
            "preempted epoch will restart from its first batch on resume."
        )
        return None
    if on_boundary is not None:
        add_boundary_callback(frame, on_boundary)
    epoch_iterator = frame.f_locals["epoch_iterator"]
    if distributed_size > 1:
        logger.warning(
            "Exact mid-epoch resume is not available with several workers yet: a preempted "
            "epoch will restart from its first batch on resume (epoch-boundary resume stays "
            "exact)."
        )
        return None
    data, reason = (adapt or _adapt)(epoch_iterator, seed)
    return data if data is not None else _restarts(reason)


def _adapt(epoch_iterator: Any, seed: int) -> tuple[Any, str | None]:
    """``(handle, None)`` for an input Keras 3's TensorFlow loop reads that this module
    resumes, else ``(None, reason)``."""
    adapter = epoch_iterator.data_adapter
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    if isinstance(adapter, ArrayDataAdapter):
        if epoch_iterator.steps_per_epoch:
            return None, "arrays with steps_per_epoch (an epoch is not one pass over the data)"
        if _has_sparse(adapter._inputs):
            return None, "sparse array inputs"
        return _ArrayData(epoch_iterator, adapter, seed), None
    if isinstance(adapter, PyDatasetAdapter):
        if epoch_iterator.steps_per_epoch or adapter.py_dataset.num_batches is None:
            return None, "a PyDataset with steps_per_epoch or without a length"
        return _PyDatasetData(epoch_iterator, adapter, seed), None
    if isinstance(adapter, TFDatasetAdapter):
        data = _TFDatasetData.make(epoch_iterator, adapter)
        if data is None:
            return None, "a tf.data.Dataset of unknown length without steps_per_epoch"
        data.end_epochs_with_passes(getattr(epoch_iterator, "steps_per_execution", 1))
        return data, None
    return None, f"a {type(adapter).__name__} input (e.g. a Python generator) cannot be rewound"


def _restarts(reason: str | None) -> None:
    logger.warning(
        "Exact mid-epoch resume is not available for %s: a preempted epoch will restart from "
        "its first batch on resume (epoch-boundary resume stays exact).",
        reason,
    )


def add_boundary_callback(fit_frame: Any, on_boundary: Callable[[], None]) -> None:
    """Put a :class:`_BatchBoundary` calling ``on_boundary`` first in the fit()'s callbacks."""
    callback_list = fit_frame.f_locals.get("callbacks")
    if callback_list is not None and hasattr(callback_list, "callbacks"):
        # A new list, not an insert: CallbackList is iterating the old one right now.
        callback_list.callbacks = [_BatchBoundary(on_boundary), *callback_list.callbacks]


class _BatchBoundary(keras.callbacks.Callback):
    """First in the fit()'s callback list: calls back before any epoch-end reaction (and before
    any batch begins, once every callback's ``on_epoch_begin`` has run)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__()
        self._fn = fn

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._fn()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._fn()

    def on_test_begin(self, logs: Any = None) -> None:
        self._fn()

    def on_train_end(self, logs: Any = None) -> None:
        self._fn()


def _metric_variables(model: KerasModel) -> list[tuple[str, Any]]:
    """``(path, variable)`` of the model's metric accumulators (Keras 2: of ``model.metrics``,
    whose variables are named per metric, e.g. ``accuracy/total:0``)."""
    if backend.IS_KERAS2:
        return [(f"{m.name}/{v.name}", v) for m in model.metrics for v in m.variables]
    return [(v.path, v) for v in model.metrics_variables]


def capture_metrics(model: KerasModel) -> list[Any]:
    """The values of ``model.metrics_variables`` (the running epoch's accumulators)."""
    values = [(path, np.asarray(v.numpy())) for path, v in _metric_variables(model)]
    return [{"path": path, "dtype": a.dtype.name, "value": a.tolist()} for path, a in values]


def restore_metrics(
    model: KerasModel,
    saved: list[Any],
    element_spec: Any = None,
    build: Callable[[Any, Any], None] | None = None,
) -> None:
    """Assign what :func:`capture_metrics` recorded (same model, same compile()).

    Keras builds the compiled metrics lazily, in the first training step; ``element_spec``
    (the input's batch spec) lets Keras build them now, as it does itself under a strategy
    (``build(model, element_spec)``; Keras 3's symbolic build by default).
    """
    variables = _metric_variables(model)
    if len(variables) != len(saved) and element_spec is not None:
        if build is None:
            model._symbolic_build(data_batch=element_spec)
        else:
            build(model, element_spec)
        variables = _metric_variables(model)
    if [path for path, _ in variables] != [item["path"] for item in saved]:
        logger.warning(
            "The model's metric variables differ from the checkpoint's (%d vs %d): the resumed "
            "epoch's metrics start from zero.",
            len(variables),
            len(saved),
        )
        return
    for (_, variable), item in zip(variables, saved, strict=True):
        variable.assign(np.asarray(item["value"], dtype=item["dtype"]))


def _has_sparse(inputs: Any) -> bool:
    from keras.src import tree
    from keras.src.trainers.data_adapters import array_slicing

    sliceable = array_slicing.convert_to_sliceable(inputs, target_backend="tensorflow")
    return any(
        isinstance(x, array_slicing.TensorflowSparseWrapper)
        or type(x).__name__ in ("SparseTensor", "RaggedTensor")
        for x in tree.flatten(sliceable)
    )


class _EpochIterable:
    """Stands in for ``TFEpochIterator._distributed_dataset``: ``iter()`` asks the owner."""

    def __init__(self, owner: _Base, element_spec: Any) -> None:
        self._owner = owner
        self.element_spec = element_spec

    def __iter__(self) -> Iterator[Any]:
        return self._owner._epoch_iterator()


class _Base:
    kind = "base"

    def __init__(self, epoch_iterator: Any, num_batches: int) -> None:
        self.num_batches = num_batches
        self._epoch = 0
        self._start = 0
        self._original = self._hook(epoch_iterator)

    def _hook(self, epoch_iterator: Any) -> Any:
        """Make the fit loop iterate :class:`_EpochIterable`; returns the loop's own dataset."""
        self._keras_iterator = epoch_iterator
        self._strategy = epoch_iterator._distribute_strategy
        original = epoch_iterator._distributed_dataset
        epoch_iterator._distributed_dataset = _EpochIterable(
            self, getattr(original, "element_spec", None)
        )
        epoch_iterator._current_iterator = None
        return original

    @property
    def element_spec(self) -> Any:
        """The spec of one batch (to build the model's metrics before the first step)."""
        return getattr(self._original, "element_spec", None)

    def begin_epoch(self, epoch: int, start_batch: int) -> None:
        """Called at every epoch begin: the next iterator Keras makes starts at ``start_batch``
        of ``epoch``, and this epoch runs only the batches left."""
        self._epoch = epoch
        self._start = start_batch
        self._set_epoch_steps(self.num_batches - start_batch)

    def _set_epoch_steps(self, steps: int) -> None:
        self._keras_iterator._num_batches = steps

    def release(self) -> None:
        """``fit()`` has ended: drop the fit loop's epoch iterator (it holds this object), so
        it and the ``tf.data`` iterator in it are freed as ``fit()`` returns. Kept to the exit,
        an iterator a preemption cut made TensorFlow log "Error occurred when finalizing
        GeneratorDataset iterator" as the process ended."""
        iterator = getattr(self, "_keras_iterator", None)  # Keras 2's handler sets none
        self._keras_iterator = None
        if iterator is not None:
            # Keras's epoch iterator also holds itself (through the generator it iterates
            # with): a cycle that lives until a garbage collection, often the one at exit.
            iterator._current_iterator = None
            iterator._epoch_iterator = None

    def _distribute(self, dataset: Any) -> Any:
        return self._strategy.experimental_distribute_dataset(dataset)

    def _epoch_iterator(self) -> Iterator[Any]:
        raise NotImplementedError

    def snapshot(self, epoch: int, batches_done: int, checkpoint_dir: str) -> dict[str, Any]:
        return {"kind": self.kind, "epoch": epoch, "batch": batches_done, **self._extra()}

    def _extra(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any], checkpoint_dir: str) -> int:
        """Check ``state`` fits this input; returns the batch the resumed epoch starts at, or
        0 (with a warning) when it does not fit."""
        if state.get("kind") != self.kind or int(state.get("num_batches", -1)) != self.num_batches:
            logger.warning(
                "The checkpoint's data position (%s, %s batches per epoch) does not fit this "
                "fit() input (%s, %d batches per epoch): the interrupted epoch restarts from "
                "its first batch.",
                state.get("kind"),
                state.get("num_batches"),
                self.kind,
                self.num_batches,
            )
            return 0
        self._restore_extra(state, checkpoint_dir)
        return int(state["batch"])

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        pass


def _epoch_order(seed: int, epoch: int, n: int, shuffle: Any) -> np.ndarray:
    """The order of the ``n`` items of ``epoch``: a permutation drawn from ``(seed, epoch)``."""
    if shuffle and shuffle != "batch":
        return np.random.default_rng([seed, epoch]).permutation(n)
    return np.arange(n)


class _ArrayData(_Base):
    """NumPy / tensor arrays: per-epoch permutation from ``(seed, epoch)``, gathered in TF."""

    kind = "arrays"

    def __init__(self, epoch_iterator: Any, adapter: Any, seed: int) -> None:
        self._adapter = adapter
        self._seed = int(seed)
        self._dataset: Any = None
        # The epoch's batches, in a box the pipeline's generator reads: TensorFlow keeps that
        # generator to the process's end, and through a `self` it kept this object, the fit
        # loop's iterator and the pipeline (a copy of the arrays) for every fit() call.
        self._box: list[list[np.ndarray]] = [[]]
        super().__init__(epoch_iterator, int(adapter.num_batches))

    @property
    def _batches(self) -> list[np.ndarray]:
        return self._box[0]

    @_batches.setter
    def _batches(self, batches: list[np.ndarray]) -> None:
        self._box[0] = batches

    def _extra(self) -> dict[str, Any]:
        return {"seed": self._seed, "num_batches": self.num_batches}

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        self._seed = int(state["seed"])

    def _epoch_batches(self, n: int, bs: int, shuffle: Any) -> list[np.ndarray]:
        """The sample indices of the batches left in this epoch (from ``self._start``)."""
        order = _epoch_order(self._seed, self._epoch, n, shuffle)
        batches = [order[b * bs : (b + 1) * bs] for b in range(self._start, self.num_batches)]
        if shuffle == "batch":
            batches = [
                b[np.random.default_rng([self._seed, self._epoch, i]).permutation(len(b))]
                for i, b in enumerate(batches, start=self._start)
            ]
        return batches

    def _epoch_iterator(self) -> Iterator[Any]:
        adapter = self._adapter
        self._batches = self._epoch_batches(
            adapter._num_samples, adapter._batch_size, adapter._shuffle
        )
        if self._dataset is None:
            self._dataset = self._distribute(self._build_dataset())
        return iter(self._dataset)

    def _static_batch(self) -> int | None:
        """The batch size when Keras's own pipeline gives its batches a static one (every
        batch full), else None: the same spec as Keras's, so a train function Keras traced
        for this input (an earlier fit()) is reused, not traced again (~1-3 s for a large
        model)."""
        import tensorflow as tf

        size = self._adapter._batch_size
        first = next(iter(tf.nest.flatten(self.element_spec)), None)
        shape = getattr(first, "shape", None)
        static = shape[0] if shape is not None and shape.rank else None
        return size if static == size and self._adapter._num_samples % size == 0 else None

    def _build_dataset(self) -> Any:
        """The input pipeline, built (and its map traced) once per fit(): each iterator takes
        the batches of its epoch from ``self._batches`` when it starts."""
        import tensorflow as tf
        from keras.src import tree
        from keras.src.trainers.data_adapters import array_slicing

        inputs = array_slicing.convert_to_sliceable(
            self._adapter._inputs, target_backend="tensorflow"
        )
        inputs_ds = tf.data.Dataset.from_tensors(tree.lists_to_tuples(inputs)).repeat()
        box = self._box
        indices = tf.data.Dataset.from_generator(
            lambda: iter(box[0]),
            output_signature=tf.TensorSpec([self._static_batch()], tf.int64),
        )

        def grab_batch(i: Any, data: Any) -> Any:
            return tree.traverse(
                lambda x: (
                    None
                    if isinstance(x, (list, tuple, dict))
                    else (tf.gather(x, i, axis=0) if tf.is_tensor(x) else x)
                ),
                data,
            )

        # No tensor-dependent control flow in grab_batch: AutoGraph's rewrite of it was most of
        # the pipeline's build time (~1 CPU-s of a resume, issue 41).
        dataset = tf.data.Dataset.zip((indices, inputs_ds)).map(
            tf.autograph.experimental.do_not_convert(grab_batch),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        options = tf.data.Options()
        options.experimental_optimization.apply_default_optimizations = False
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _stateful_dataset(py_dataset: Any, base: type) -> bool:
    """Whether ``py_dataset`` has ``get_state()``/``load_state()``; warns once when it overrides
    ``on_epoch_end`` of ``base`` (it may reorder itself there) without them."""
    stateful = callable(getattr(py_dataset, "get_state", None)) and callable(
        getattr(py_dataset, "load_state", None)
    )
    reorders = type(py_dataset).on_epoch_end is not base.on_epoch_end
    if reorders and not stateful:
        logger.warning(
            "%s overrides on_epoch_end() but has no get_state()/load_state(): if it "
            "reorders itself there, a resumed run continues the interrupted epoch in its "
            "freshly built order, not the interrupted run's. Give it get_state()/"
            "load_state() to make mid-epoch resume exact.",
            type(py_dataset).__name__,
        )
    return stateful


class _PyDatasetData(_Base):
    """A ``keras.utils.PyDataset``: epochs Keras can produce itself go through Keras (workers,
    multiprocessing); a resumed epoch and shuffled epochs are read here in a known order."""

    kind = "pydataset"

    def __init__(self, epoch_iterator: Any, adapter: Any, seed: int) -> None:
        self._adapter = adapter
        self._seed = int(seed)
        self._py_dataset = adapter.py_dataset
        self._stateful = _stateful_dataset(self._py_dataset, keras.utils.PyDataset)
        self._enqueuer = getattr(adapter, "enqueuer", None)
        super().__init__(epoch_iterator, int(self._py_dataset.num_batches))

    def _keras_reads(self) -> bool:
        """Whether Keras reads the epoch beginning (its own order: from the first batch,
        unshuffled), with its workers if any."""
        return self._start == 0 and not self._adapter.shuffle

    def begin_epoch(self, epoch: int, start_batch: int) -> None:
        super().begin_epoch(epoch, start_batch)
        # Keras's enqueuer (workers=...) runs only for the epochs Keras reads: one started for
        # an epoch read here reads ahead in its own order, and what it read is served first in
        # the next epoch Keras reads (its stop() keeps it for "the next run").
        self._adapter.enqueuer = self._enqueuer if self._keras_reads() else None

    def _extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seed": self._seed, "num_batches": self.num_batches}
        if self._stateful:
            out["py_dataset"] = self._py_dataset.get_state()
        return out

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        self._seed = int(state["seed"])
        if self._stateful and "py_dataset" in state:
            self._py_dataset.load_state(state["py_dataset"])

    def _epoch_iterator(self) -> Iterator[Any]:
        import tensorflow as tf

        adapter = self._adapter
        if self._keras_reads():
            return iter(self._original)  # Keras's own reading (workers, multiprocessing)
        order = _epoch_order(self._seed, self._epoch, self.num_batches, bool(adapter.shuffle))
        wanted = [int(i) for i in order[self._start :]]

        def batches() -> Iterator[Any]:
            for i in wanted:
                yield adapter._standardize_batch(adapter.py_dataset[i])

        adapter.get_tf_dataset()  # makes Keras compute the output signature once
        dataset = tf.data.Dataset.from_generator(
            batches, output_signature=adapter._output_signature
        ).prefetch(tf.data.AUTOTUNE)
        return iter(self._distribute(dataset))


class _TFDatasetData(_Base):
    """A ``tf.data.Dataset``: one iterator for the whole ``fit()``, checkpointed by TF."""

    kind = "tf.data"
    #: Whether the iterator may be saved; None until the first checkpoint asks
    #: (:meth:`_saveable`).
    _iterator_saveable: bool | None = None
    #: Whether each epoch's iterator ends with its pass (:meth:`end_epochs_with_passes`).
    _pass_ends = False

    def __init__(
        self, epoch_iterator: Any, dataset: Any, num_batches: int, steps_given: bool
    ) -> None:
        super().__init__(epoch_iterator, num_batches)
        self._raw_dataset = dataset
        self._dataset = tfdata_state.saving_positions(dataset)
        self._iterator: Any = None
        self._steps_given = steps_given

    @classmethod
    def make(cls, epoch_iterator: Any, adapter: Any) -> _TFDatasetData | None:
        dataset = adapter._dataset
        cardinality = int(dataset.cardinality())
        steps = epoch_iterator.steps_per_epoch
        if steps:
            return cls(epoch_iterator, dataset, int(steps), True)
        if cardinality > 0:
            # A pass is an epoch; repeating inside one iterator keeps the per-pass reshuffle
            # seeds in the iterator's own (checkpointable) state.
            return cls(epoch_iterator, dataset.repeat(), cardinality, False)
        return None

    def end_epochs_with_passes(self, steps_per_execution: int) -> None:
        """Make each epoch end with its pass when an execution of ``steps_per_execution``
        steps would run on from the one iterator over the repeated dataset into the next pass
        (Keras, with a fresh iterator per pass, cuts that execution short). With
        ``steps_per_epoch`` Keras keeps one iterator too: the executions stay as they are."""
        self._pass_ends = not self._steps_given and self.num_batches % steps_per_execution != 0

    def _set_epoch_steps(self, steps: int) -> None:
        if self._steps_given:
            self._keras_iterator.steps_per_epoch = steps
        # An endless iterator: Keras must stop after `steps`, not wait for the end of the data.
        self._keras_iterator._num_batches = steps

    def release(self) -> None:
        super().release()
        self._iterator = None

    def _iter(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._distribute(self._dataset))
        return self._iterator

    def _epoch_iterator(self) -> Iterator[Any]:
        if not self._pass_ends:
            return self._iter()
        # The epoch's batches left, read from the one iterator: a Python iterator, which Keras
        # reads batch by batch (zip(range(k), iterator)) and which ends with the pass. Not an
        # iterator per pass: TensorFlow's checkpoint of one whose shuffle has read its pass to
        # the end (a prefetch reads ahead, as far as the load lets it) leaves out the state of
        # the dataset's seed generator, and the passes after a resume reshuffle otherwise.
        return itertools.islice(self._iter(), self.num_batches - self._start)

    def snapshot(self, epoch: int, batches_done: int, checkpoint_dir: str) -> dict[str, Any] | None:
        import tensorflow as tf

        if not self._saveable():
            return None
        folder = os.path.join(checkpoint_dir, ITERATOR_DIRNAME)
        os.makedirs(folder, exist_ok=True)
        with tf_logging.root_left_alone():
            checkpoint = tf.train.Checkpoint(iterator=self._iter())
            checkpoint.write(os.path.join(folder, _ITERATOR_PREFIX))
        return {
            "kind": self.kind,
            "epoch": epoch,
            "batch": batches_done,
            "num_batches": self.num_batches,
            "iterator": f"{ITERATOR_DIRNAME}/{_ITERATOR_PREFIX}",
        }

    def _saveable(self) -> bool:
        """Whether the iterator may be saved, decided once at the first checkpoint from what
        of the pipeline its checkpoint leaves out (the rule and the warnings:
        ``_tfdata_state.py``)."""
        if self._iterator_saveable is None:
            then = "a resumed run reads the pipeline from its start (a cut epoch restarts)"
            self._iterator_saveable = tfdata_state.saveable(
                self._raw_dataset, self._iter(), "this fit()", then, logger
            )
        return self._iterator_saveable

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        import tensorflow as tf

        path = os.path.join(checkpoint_dir, state["iterator"])
        with tf_logging.root_left_alone():
            tf.train.Checkpoint(iterator=self._iter()).read(path).assert_consumed()


__all__ = [
    "ITERATOR_DIRNAME",
    "ResumableData",
    "attach",
    "build_from_fit_data",
    "capture_metrics",
    "default_seed",
    "find_fit_frame",
    "restore_metrics",
]
