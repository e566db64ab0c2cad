"""Resumable input for Keras 3's ``fit()`` on the JAX and PyTorch backends (``KERAS_BACKEND=jax``
or ``torch``).

Keras's JAX fit loop (``keras/src/backend/jax/trainer.py``) draws its batches from
``JAXEpochIterator._get_iterator()``, a fresh iterator of the data adapter every epoch (one
iterator for the whole ``fit()`` when ``steps_per_epoch`` is given). :func:`attach` replaces that
method on the running epoch iterator, so every batch comes from an iterator this module controls,
in the order and from the position the checkpoint records, with the same per-input rules as the
TensorFlow loop (:mod:`ckptstore.keras_io.data._resumable`, whose classes are reused). Keras's
PyTorch loop (``keras/src/backend/torch/trainer.py``) has the same shape
(``TorchEpochIterator._get_iterator()``): the same classes hook it, and hand it torch tensors.

=====================  =========================================================================
input given to fit()   how an epoch is reproduced
=====================  =========================================================================
NumPy arrays           batches of the permutation drawn from ``(seed, epoch)``, sliced in NumPy
PyDataset / Sequence   ``py_dataset[i]`` for ``i`` in the epoch's order
tf.data.Dataset        one TensorFlow iterator for the whole fit, checkpointed by TensorFlow
Python generator with  one stream for the whole fit; the checkpoint records how many batches
``steps_per_epoch``    were drawn and a resumed run skips that many (without training on them).
                       Exact when the generator yields the same sequence each time the script
                       builds it (seeded), which a resume needs anyway.
torch DataLoader       one iterator per epoch, a resumed one made from the generator states
                       its epoch began with (:mod:`~ckptstore.keras_io.data._resumable_torch`)
=====================  =========================================================================

No batch is read ahead of the step that trains on it (the look-ahead Keras adds on accelerators
is left out), so a checkpoint's position is always the next untrained batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ckptstore.keras_io.data import _resumable as base


class _JaxHook:
    """Mixin: hook the JAX epoch iterator's ``_get_iterator`` instead of TensorFlow's dataset."""

    def _hook(self, epoch_iterator: Any) -> Any:
        self._keras_iterator = epoch_iterator
        original = epoch_iterator._get_iterator
        # An instance attribute shadows the method: Keras's loop calls ours from now on.
        epoch_iterator._get_iterator = _placed(self._epoch_iterator)
        epoch_iterator._current_iterator = None
        return original

    @property
    def element_spec(self) -> Any:
        return None  # fit() on JAX builds the metrics before on_train_begin


def _placed(epoch_batches: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
    """``epoch_batches`` with every batch placed on the devices as Keras's JAX loop places it
    under a ``keras.distribution`` (``DataParallel``, ``ModelParallel``: split along the batch
    dimension; ``JAXEpochIterator._get_distributed_iterator``), which replacing
    ``_get_iterator`` bypasses: without it each device would train on the whole batch. Batches
    already placed (Keras's own iterator, for inputs read unchanged) pass through."""
    import keras

    if keras.backend.backend() != "jax":
        return epoch_batches
    from keras.src.distribution import distribution_lib

    distribution = distribution_lib.distribution()
    if distribution is None:
        return epoch_batches
    import jax
    from keras.src import tree
    from keras.src.backend.jax.distribution_lib import distribute_data_input

    def place(value: Any, layout: Any) -> Any:
        if value is None or (isinstance(value, jax.Array) and value.sharding == layout):
            return value
        return distribute_data_input(value, layout, distribution.batch_dim_name)

    def placed() -> Iterator[Any]:
        layouts = None
        for batch in epoch_batches():
            if layouts is None:  # the first batch's shapes, as Keras computes them
                layouts = tree.map_structure(
                    lambda v: (
                        None if v is None else distribution.get_data_layout(v.shape).backend_layout
                    ),
                    batch,
                )
            yield tree.map_structure(place, batch, layouts)

    return placed


def _to_compatible(batches: Any) -> Iterator[Any]:
    """``batches`` as the running backend's fit loop takes them (what Keras's adapters do)."""
    import keras
    from keras.src.trainers.data_adapters import data_adapter_utils

    if keras.backend.backend() == "torch":
        # What Keras's get_torch_dataloader yields, without its DataLoader (see _iterate)
        from keras import ops
        from keras.src import tree

        convert = ops.convert_to_tensor
        return (tree.map_structure(convert, b, none_is_leaf=False) for b in batches)
    return data_adapter_utils.get_jax_iterator(batches)


def _iterate(iterable: Any) -> Iterator[Any]:
    """``iter(iterable)``, leaving torch's global generator as it was: a ``torch.utils.data``
    ``DataLoader`` (Keras's input on PyTorch) draws its workers' base seed from it for every
    iterator it makes, which a resumed run would do at another point of the sequence than the
    run it continues, and every Dropout mask after it would differ."""
    import sys

    if "torch" not in sys.modules:
        return iter(iterable)
    import torch

    state = torch.get_rng_state()
    try:
        return iter(iterable)
    finally:
        torch.set_rng_state(state)


class _ArrayData(_JaxHook, base._ArrayData):
    def _epoch_iterator(self) -> Iterator[Any]:
        import keras
        from keras import ops
        from keras.src import tree
        from keras.src.trainers.data_adapters import array_slicing

        adapter = self._adapter
        batches = self._epoch_batches(adapter._num_samples, adapter._batch_size, adapter._shuffle)
        target = keras.backend.backend()
        inputs = array_slicing.convert_to_sliceable(adapter._inputs, target_backend=target)

        def take(sliceable: Any, indices: np.ndarray) -> Any:
            if target == "torch":  # as Keras's ArrayDataAdapter.get_torch_dataloader
                return ops.convert_to_tensor(
                    sliceable.convert_to_torch_compatible(sliceable[indices])
                )
            return sliceable.convert_to_jax_compatible(sliceable[indices])

        for indices in batches:
            yield tree.map_structure(lambda s, i=indices: take(s, i), inputs)


class _PyDatasetData(_JaxHook, base._PyDatasetData):
    def _epoch_iterator(self) -> Iterator[Any]:
        adapter = self._adapter
        if self._keras_reads():
            return _iterate(self._original())  # Keras's own reading (workers, multiprocessing)
        order = base._epoch_order(self._seed, self._epoch, self.num_batches, bool(adapter.shuffle))
        wanted = [int(i) for i in order[self._start :]]
        return _to_compatible(adapter._standardize_batch(adapter.py_dataset[i]) for i in wanted)


class _Stream:
    """One iterator for the whole fit() (``steps_per_epoch`` given / endless input); Keras may
    ask for a new epoch iterator at any epoch end, which keeps drawing from the same stream."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._it: Iterator[Any] | None = None
        self.drawn = 0
        self.skip = 0

    def iterator(self) -> Iterator[Any]:
        if self._it is None:
            self._it = _iterate(self._make())
            for _ in range(self.skip):  # a resumed run: batches the checkpoint trained on
                next(self._it)
            self.drawn = self.skip
        return self._it

    def epoch_iterator(self) -> Iterator[Any]:
        while True:
            try:
                batch = next(self.iterator())
            except StopIteration:
                return
            self.drawn += 1
            yield batch


class _TFDatasetData(_JaxHook, base._TFDatasetData):
    def _iter(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._dataset)
        return self._iterator

    def _epoch_iterator(self) -> Iterator[Any]:
        from keras.src import tree

        # Without steps_per_epoch an epoch is one pass: the iterator over the repeated data
        # ends with it, or an execution of steps_per_execution batches cut short by the
        # pass's end (Keras's fresh iterator per pass) would run on into the next pass.
        left = None if self._steps_given else self.num_batches - self._start

        def batches() -> Iterator[Any]:
            iterator, drawn = self._iter(), 0
            while left is None or drawn < left:
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                drawn += 1
                yield tree.map_structure(lambda x: x.numpy(), batch, none_is_leaf=False)

        return _to_compatible(batches())


class _GeneratorData(_JaxHook, base._Base):
    """A Python generator with ``steps_per_epoch``: one stream, fast-forwarded on resume."""

    kind = "generator"

    def __init__(self, epoch_iterator: Any, steps: int) -> None:
        self._stream = _Stream(lambda: self._original())
        super().__init__(epoch_iterator, int(steps))

    def _set_epoch_steps(self, steps: int) -> None:
        self._keras_iterator.steps_per_epoch = steps
        self._keras_iterator._num_batches = steps

    def _epoch_iterator(self) -> Iterator[Any]:
        return self._stream.epoch_iterator()

    def _extra(self) -> dict[str, Any]:
        return {"num_batches": self.num_batches, "drawn": self._stream.drawn}

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        self._stream.skip = int(state["drawn"])


#: Puts the interrupted epoch's metric accumulators back (the TensorFlow loop's own rule).
restore_metrics = base.restore_metrics


def build_from_fit_data(model: Any) -> None:
    """Nothing to do: Keras's JAX and PyTorch loops build the model from a batch before the
    callbacks start (``Trainer._symbolic_build``)."""


def _adapt(epoch_iterator: Any, seed: int) -> tuple[Any, str | None]:
    """``(handle, None)`` for an input this module resumes, else ``(None, reason)``."""
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = epoch_iterator.data_adapter
    steps = epoch_iterator.steps_per_epoch
    if isinstance(adapter, ArrayDataAdapter):
        if steps:
            return None, "arrays with steps_per_epoch (an epoch is not one pass over the data)"
        return _ArrayData(epoch_iterator, adapter, seed), None
    if isinstance(adapter, PyDatasetAdapter):
        if steps or adapter.py_dataset.num_batches is None:
            return None, "a PyDataset with steps_per_epoch or without a length"
        return _PyDatasetData(epoch_iterator, adapter, seed), None
    if isinstance(adapter, GeneratorDataAdapter):
        if not steps:
            return None, "a Python generator without steps_per_epoch (an epoch has no length)"
        return _GeneratorData(epoch_iterator, steps), None
    if type(adapter).__name__ == "TFDatasetAdapter":
        data = _TFDatasetData.make(epoch_iterator, adapter)
        if data is not None:
            return data, None
        return None, "a tf.data.Dataset of unknown length without steps_per_epoch"
    # a torch DataLoader: _resumable_torch, which comes here for every other input
    return None, f"a {type(adapter).__name__} input (it cannot be rewound)"


__all__ = ["build_from_fit_data", "restore_metrics"]
