"""Determined's Sequence helpers: :class:`InMemorySequence` and :class:`SequenceAdapter`.

Both follow the Keras ``tf.keras`` is (:mod:`ckptstore.keras_io.backend`): on Keras 3
:class:`InMemorySequence` is a ``keras.utils.PyDataset``, on Keras 2 (``TF_USE_LEGACY_KERAS=1``) a
``tf.keras.utils.Sequence``; :data:`SEQUENCE_BASE` is that class.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from ckptstore import errors
from ckptstore.keras_io.backend import keras
from ckptstore.validators import int_at_least

#: The batch-sequence base class of the running Keras: ``keras.utils.PyDataset`` on Keras 3,
#: ``tf.keras.utils.Sequence`` on Keras 2 (tf_keras has no PyDataset).
SEQUENCE_BASE: Any = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence


class InMemorySequence(SEQUENCE_BASE):  # type: ignore[misc,valid-type]
    """NumPy data and labels served as a ``keras.utils.PyDataset`` of fixed-size batches
    (a ``tf.keras.utils.Sequence`` on Keras 2).

    Batch ``i`` is ``data[i*batch_size:(i+1)*batch_size]`` (the last batch may be smaller), so
    the position in the data is just the batch index: a resumed trial continues at the next batch.

    Args:
        data: an array (or a list/dict of arrays for several inputs) with one row per record.
        labels: an array (or a list/dict of arrays for several outputs, e.g.
            ``{"a": y_a, "b": y_b}`` for a model whose outputs are named ``a`` and ``b``) with one
            row per record.
        batch_size: records per batch, a positive integer.

    Example::

        from ckptstore.keras import InMemorySequence

        seq = InMemorySequence(data=x_train, labels=y_train, batch_size=32)
        x0, y0 = seq[0]
    """

    def __init__(self, data: Any, labels: Any, batch_size: int) -> None:
        super().__init__()
        int_at_least("batch_size", batch_size, 1)
        self._data = data
        self._labels = labels if isinstance(labels, (dict, list, tuple)) else np.asarray(labels)
        self._batch_size = batch_size
        n, n_labels = _num_records(data), _num_records(self._labels)
        if n != n_labels:
            raise errors.InvalidConfig(
                f"InMemorySequence got {n} records of data but {n_labels} labels; "
                "pass data and labels with the same number of rows."
            )
        self._n = n

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def __len__(self) -> int:
        return math.ceil(self._n / self._batch_size)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if index < 0 or index >= len(self):
            raise IndexError(f"InMemorySequence has {len(self)} batches, asked for {index}")
        sl = slice(index * self._batch_size, (index + 1) * self._batch_size)
        return _slice(self._data, sl), _slice(self._labels, sl)


class SequenceAdapter:
    """A ``keras.utils.Sequence`` (``PyDataset``) with Determined's loading options.

    ``workers=0`` loads batches in the calling thread; ``workers=N`` with
    ``use_multiprocessing=False`` loads ahead with N threads, with ``use_multiprocessing=True``
    with N forked processes. Batches always come back in order, so training is the same whatever
    the settings, and a resumed trial continues at the next batch.

    Args:
        sequence: the ``keras.utils.Sequence`` / ``keras.utils.PyDataset`` to read.
        use_multiprocessing: load in processes instead of threads.
        workers: how many loaders; 0 loads in the calling thread.
        max_queue_size: how many batches to load ahead at most.

    Example::

        from ckptstore.keras import SequenceAdapter

        def build_training_data_loader(self):
            return SequenceAdapter(MySequence(), workers=2, use_multiprocessing=False)
    """

    def __init__(
        self,
        sequence: Any,
        use_multiprocessing: bool = False,
        workers: int = 1,
        max_queue_size: int = 10,
    ) -> None:
        if not hasattr(sequence, "__getitem__") or not hasattr(sequence, "__len__"):
            raise errors.InvalidConfig(
                "SequenceAdapter needs a keras.utils.Sequence (PyDataset) with __len__ and "
                f"__getitem__. Received: {type(sequence).__name__}."
            )
        for name, value, low in (("workers", workers, 0), ("max_queue_size", max_queue_size, 1)):
            int_at_least(name, value, low)
        self.sequence = sequence
        self.use_multiprocessing = bool(use_multiprocessing)
        self.workers = workers
        self.max_queue_size = max_queue_size

    def __len__(self) -> int:
        return len(self.sequence)

    def iterate(self, start: int = 0) -> Iterator[Any]:
        """Batches ``start``, ``start+1``, ... to the end of the sequence, in order."""
        n = len(self.sequence)
        if self.workers == 0:
            for i in range(start, n):
                yield self.sequence[i]
            return
        if self.use_multiprocessing:
            global _FORKED_SEQUENCE
            _FORKED_SEQUENCE = self.sequence
            pool: concurrent.futures.Executor = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("fork")
            )
            fetch: Any = _fetch_forked
        else:
            pool = concurrent.futures.ThreadPoolExecutor(self.workers)
            fetch = self.sequence.__getitem__
        try:
            pending: list[concurrent.futures.Future] = []
            nxt = start
            while nxt < n or pending:
                while nxt < n and len(pending) < self.max_queue_size:
                    pending.append(pool.submit(fetch, nxt))
                    nxt += 1
                yield pending.pop(0).result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def on_epoch_end(self) -> None:
        hook = getattr(self.sequence, "on_epoch_end", None)
        if callable(hook):
            hook()


_FORKED_SEQUENCE: Any = None


def _fetch_forked(index: int) -> Any:
    return _FORKED_SEQUENCE[index]


def _num_records(data: Any) -> int:
    if isinstance(data, dict):
        data = next(iter(data.values()))
    elif isinstance(data, (list, tuple)):
        data = data[0]
    return len(data)


def _slice(data: Any, sl: Any) -> Any:
    if isinstance(data, dict):
        return {k: np.asarray(v)[sl] for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [np.asarray(v)[sl] for v in data]
    return np.asarray(data)[sl]


#: Determined's ``det.keras.ArrayLike``: what ``SequenceAdapter`` / ``InMemorySequence`` accept.
ArrayLike = np.ndarray | list[np.ndarray] | dict[str, np.ndarray]
#: Determined's ``det.keras.InputData``: what ``build_training_data_loader()`` /
#: ``build_validation_data_loader()`` may return (a Keras ``PyDataset``/``Sequence``, a
#: ``tf.data.Dataset``, a :class:`SequenceAdapter`, or an ``(x, y[, sample_weight])`` tuple).
InputData = SEQUENCE_BASE | tf.data.Dataset | SequenceAdapter | tuple

__all__ = ["SEQUENCE_BASE", "ArrayLike", "InMemorySequence", "InputData", "SequenceAdapter"]
