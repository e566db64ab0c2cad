"""The five training data types of a TFKerasTrial, read batch by batch with a resumable position.

:func:`training_data` turns what ``build_training_data_loader()`` returned into a
:class:`TrainingData`: ``next_batch()`` gives ``(x, y, sample_weight)``, ``position()`` /
``restore(position)`` save and restore where in the data training is (pass and batch index), so a
resumed trial continues at the next batch. NumPy arrays are shuffled per pass with a permutation
seeded by (trial seed, pass) — the same on resume. A ``tf.data.Dataset`` of known length is read
through one iterator over ``dataset.repeat()`` whose state (position, shuffle buffers and
per-pass shuffle seeds) goes into the checkpoint with ``tf.train.Checkpoint``, so a resumed trial
reads exactly the batches an uninterrupted one would; one of unknown length resumes by skipping
the batches already seen in the current pass (exact for a deterministic order). Validation data goes to ``model.evaluate`` as is (:func:`evaluate_kwargs`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.keras_io.data import _tfdata_state as tfdata_state
from ckptstore.keras_io.trial.sequences import (
    SEQUENCE_BASE,
    SequenceAdapter,
    _num_records,
    _slice,
)

logger = logging.getLogger(__name__)

DATA_TYPES_HELP = (
    "Return (x, y), (x, y, sample_weights), inputs only (an array, a dict of arrays or (x,)), "
    "a tf.data.Dataset, a keras.utils.PyDataset (a tf.keras.utils.Sequence on Keras 2) or a "
    "ckptstore.keras.SequenceAdapter."
)


def is_tf_dataset(data: Any) -> bool:
    import sys

    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _as_triple(batch: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one batch, unpacked as Keras's ``fit()`` unpacks it: a
    tuple (or list) of 1-3 parts, or anything else as inputs only (images for a GAN's custom
    ``train_step``, a dict of named inputs)."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        return (batch, None, None)
    if len(batch) in (1, 2, 3):
        padded = (*batch, None, None)
        return (padded[0], padded[1], padded[2])
    raise errors.InvalidConfig(
        "A training batch must be inputs, (inputs,), (inputs, targets) or (inputs, targets, "
        f"sample_weights), as Keras's fit() takes it; received a tuple of {len(batch)}. Make "
        "the data loader return one of those (several inputs go in a tuple or dict as the "
        "first element)."
    )


class TrainingData:
    """Batches from one training data loader, with a position that survives a checkpoint."""

    #: Batches in one pass over the data, None when unknown (e.g. a repeated tf.data.Dataset).
    batches_per_pass: int | None = None
    #: Records in one pass over the data, None when unknown.
    records_per_pass: int | None = None

    def __init__(self) -> None:
        self.pass_index = 0
        self.batch_index = 0
        self._iter: Iterator[Any] | None = None

    def position(self) -> dict[str, int]:
        """Where the next batch comes from: ``{"pass": p, "batch": b}``."""
        return {"pass": self.pass_index, "batch": self.batch_index}

    def restore(self, position: dict[str, int]) -> None:
        """Continue at ``position`` (from :meth:`position` saved in a checkpoint)."""
        self.close()
        self.pass_index = int(position.get("pass", 0))
        self.batch_index = int(position.get("batch", 0))

    def next_batch(self) -> tuple[Any, Any, Any]:
        """The next ``(x, y, sample_weight)``; starts a new pass when one ends."""
        for _ in range(2):
            if self._iter is None:
                self._iter = self._open(self.pass_index, self.batch_index)
            try:
                batch = next(self._iter)
            except StopIteration:
                self._end_pass()
                continue
            self.batch_index += 1
            return _as_triple(batch)
        raise errors.InvalidConfig(
            "The training data loader produced no batches. Return non-empty training data."
        )

    def _end_pass(self) -> None:
        self.close()
        self.pass_index += 1
        self.batch_index = 0
        self._on_pass_end()

    def _on_pass_end(self) -> None:
        pass

    def _open(self, pass_index: int, start: int) -> Iterator[Any]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop any loader threads/processes."""
        if self._iter is not None:
            close = getattr(self._iter, "close", None)
            if callable(close):
                close()
            self._iter = None


class ArrayData(TrainingData):
    """``(x, y)`` / ``(x, y, sample_weights)`` NumPy data in global batches of ``batch_size``
    rows; worker ``rank`` of ``size`` trains on its part of each (Determined's per-slot batch).

    Every worker draws the same per-pass order, so the position (pass, batch) means the same
    global batch for any number of workers: a checkpoint written by N workers resumes on M.
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        sw: Any,
        batch_size: int,
        shuffle: bool,
        seed: int,
        rank: int = 0,
        size: int = 1,
    ) -> None:
        super().__init__()
        self.rank, self.size = rank, size
        self.x, self.sw = x, (None if sw is None else np.asarray(sw))
        self.y = None if y is None else _targets(y)
        self.n = _num_records(x)
        if self.y is not None and self.n != _num_records(self.y):
            raise errors.InvalidConfig(
                f"Training data has {self.n} inputs but {_num_records(self.y)} targets; pass x "
                "and y with the same number of rows."
            )
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.batches_per_pass = -(-self.n // batch_size)
        self.records_per_pass = self.n

    def _open(self, pass_index: int, start: int) -> Iterator[Any]:
        if self.shuffle:
            order = np.random.default_rng([self.seed, pass_index]).permutation(self.n)
        else:
            order = np.arange(self.n)
        for b in range(start, self.batches_per_pass or 0):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            if self.size > 1:
                idx = np.array_split(idx, self.size)[self.rank]
            sw = None if self.sw is None else self.sw[idx]
            yield (_slice(self.x, idx), None if self.y is None else _slice(self.y, idx), sw)


class SequenceData(TrainingData):
    """A ``keras.utils.PyDataset`` / ``InMemorySequence`` / :class:`SequenceAdapter`.

    With ``size`` workers each yields per-slot batches, as Determined's did: global batch ``b``
    of a pass is the sequence's batches ``size*b .. size*b + size-1`` (of the pass's order, the
    same per-pass shuffle on every worker), worker ``rank`` reading ``size*b + rank``; a
    trailing remainder of fewer than ``size`` batches is skipped, so every worker trains every
    step. The position (pass, global batch) is the same on every worker, so a resume is exact.
    """

    def __init__(
        self, adapter: SequenceAdapter, shuffle: bool, seed: int, rank: int = 0, size: int = 1
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.size = rank, size
        self.batches_per_pass = len(adapter) // size
        if self.batches_per_pass == 0:
            raise errors.InvalidConfig(
                f"The training Sequence has {len(adapter)} batches, fewer than the {size} "
                "workers (slots_per_trial) that each need one per step. Use fewer slots or more "
                "data."
            )
        size = getattr(adapter.sequence, "batch_size", None)
        self.records_per_pass = None
        if isinstance(size, int):
            self.records_per_pass = _sequence_records(adapter.sequence, size)

    def _open(self, pass_index: int, start: int) -> Iterator[Any]:
        if not self.shuffle and self.size == 1:
            return self.adapter.iterate(start)
        n = len(self.adapter)
        if self.shuffle:
            order = np.random.default_rng([self.seed, pass_index]).permutation(n)
        else:
            order = np.arange(n)
        seq = self.adapter.sequence
        mine = order[: (self.batches_per_pass or 0) * self.size][self.rank :: self.size]
        return (seq[int(i)] for i in mine[start:])

    def _on_pass_end(self) -> None:
        self.adapter.on_epoch_end()


class DatasetData(TrainingData):
    """A ``tf.data.Dataset`` of batches: one checkpointable iterator over ``dataset.repeat()``
    when its length is known; else resuming skips the batches already seen in this pass.

    With several workers (``exact_state=False``) each reads its own shard
    (``context.wrap_dataset``) and the chief's iterator state would not fit the others' (nor
    another number of workers): the checkpoint holds no iterator state and a resume skips to
    the saved batch of the pass."""

    #: Folder of the tf.data iterator checkpoint inside a trial checkpoint.
    ITERATOR_DIRNAME = "data_iterator"

    def __init__(self, dataset: Any, exact_state: bool = True) -> None:
        super().__init__()
        self.dataset = dataset
        self.exact_state = exact_state
        cardinality = int(dataset.cardinality())
        self.batches_per_pass = cardinality if cardinality > 0 else None
        self._stream: Any = None
        self._iterator_saveable: bool | None = None  # see _saveable

    def next_batch(self) -> tuple[Any, Any, Any]:
        if self.batches_per_pass is None:
            return super().next_batch()
        batch = next(self._open_stream())
        self.batch_index += 1
        if self.batch_index >= self.batches_per_pass:
            self.pass_index += 1
            self.batch_index = 0
        return _as_triple(tuple(batch) if isinstance(batch, (tuple, list)) else batch)

    def _open_stream(self, skip: int = 0) -> Any:
        if self._stream is None:
            # the position and buffers save even when random draws in the pipeline keep state
            # outside it (see _saveable)
            repeated = tfdata_state.saving_positions(self.dataset.repeat())
            self._stream = iter(repeated.skip(skip) if skip else repeated)
        return self._stream

    def write_files(self, folder: str) -> None:
        """Save the iterator's state into ``folder`` (part of the checkpoint)."""
        if self.batches_per_pass is None or not self.exact_state or not self._saveable():
            return
        import tensorflow as tf

        path = os.path.join(folder, self.ITERATOR_DIRNAME, "iterator")
        tf.train.Checkpoint(iterator=self._open_stream(self.batch_index)).write(path)

    def _saveable(self) -> bool:
        """Whether the iterator may be saved, decided (with one warning when something is
        left out) at the first checkpoint; the rule is ``keras_io/data/_tfdata_state.py``'s."""
        if self._iterator_saveable is None:
            then = "a resumed trial skips to the saved batch of the pass"
            stream = self._open_stream(self.batch_index)
            self._iterator_saveable = tfdata_state.saveable(
                self.dataset, stream, "this trial", then, logger
            )
        return self._iterator_saveable

    def read_files(self, folder: str) -> None:
        """Restore the iterator saved by :meth:`write_files`; a checkpoint without one (older
        versions) continues by skipping to the saved batch of the pass."""
        if self.batches_per_pass is None:
            return
        import tensorflow as tf

        self._stream = None
        path = os.path.join(folder, self.ITERATOR_DIRNAME, "iterator")
        if not self.exact_state:
            self._open_stream(self.batch_index)  # this worker's shard, at the saved batch
            return
        if not os.path.exists(path + ".index"):
            logger.warning(
                "The checkpoint holds no tf.data iterator state: skipping to batch %d of the "
                "pass (exact only if the dataset's order does not change between passes).",
                self.batch_index,
            )
            self._open_stream(self.batch_index)
            return
        tf.train.Checkpoint(iterator=self._open_stream()).read(path).assert_consumed()

    def close(self) -> None:
        super().close()
        self._stream = None

    def _open(self, pass_index: int, start: int) -> Iterator[Any]:
        ds = self.dataset.skip(start) if start else self.dataset
        for batch in ds:
            yield tuple(batch) if isinstance(batch, (tuple, list)) else batch


def _targets(y: Any) -> Any:
    """The targets as arrays: one array, or a list or dict of arrays for a model with several
    outputs (Determined's ``(x, y)`` data takes all three); a list of numbers is one array."""
    if isinstance(y, dict):
        return {name: np.asarray(v) for name, v in y.items()}
    if isinstance(y, (list, tuple)) and y and all(hasattr(v, "shape") for v in y):
        return [np.asarray(v) for v in y]
    return np.asarray(y)


def _arrays(data: Any) -> tuple[Any, Any, Any] | None:
    """``(x, y, sample_weight)`` of in-memory training data (None: not in-memory data): an
    ``(x, y[, sw])`` / ``(x,)`` tuple, or inputs only (an array or a dict of arrays), as
    ``fit(x)`` takes them."""
    if isinstance(data, (tuple, list)) and len(data) in (1, 2, 3):
        return _as_triple(data)
    if isinstance(data, np.ndarray) or (
        isinstance(data, dict) and data and all(hasattr(v, "__len__") for v in data.values())
    ):
        return (data, None, None)
    return None


def _sequence_records(seq: Any, batch_size: int) -> int | None:
    n = getattr(seq, "_n", None)
    return n if isinstance(n, int) else len(seq) * batch_size


def training_data(
    data: Any,
    *,
    batch_size: int,
    shuffle: bool | None,
    seed: int,
    workers: int | None = None,
    use_multiprocessing: bool | None = None,
    max_queue_size: int | None = None,
    rank: int = 0,
    size: int = 1,
) -> TrainingData:
    """Wrap what ``build_training_data_loader()`` returned; InvalidConfig for other types.

    ``batch_size`` is the global batch size; with ``size`` workers, NumPy data is split by
    rank here and a ``tf.data.Dataset`` is taken as this worker's shard (already batched
    by the per-slot batch size, as Determined's ``wrap_dataset`` examples do)."""
    if isinstance(data, SequenceAdapter):
        return SequenceData(data, bool(shuffle), seed, rank, size)
    if isinstance(data, SEQUENCE_BASE):
        adapter = SequenceAdapter(
            data,
            use_multiprocessing=bool(use_multiprocessing),
            workers=0 if workers is None else workers,
            max_queue_size=max_queue_size or 10,
        )
        return SequenceData(adapter, bool(shuffle), seed, rank, size)
    if is_tf_dataset(data):
        if shuffle:
            logger.info("configure_fit(shuffle=True) does not reorder a tf.data.Dataset")
        return DatasetData(data, exact_state=size == 1)
    arrays = _arrays(data)
    if arrays is not None:
        shuffle = True if shuffle is None else shuffle
        return ArrayData(*arrays, batch_size, shuffle, seed, rank, size)
    raise errors.InvalidConfig(
        f"build_training_data_loader() returned a {type(data).__name__}. {DATA_TYPES_HELP}"
    )


def evaluate_kwargs(data: Any, batch_size: int, strategy: Any = None) -> dict[str, Any]:
    """Keyword arguments for ``model.evaluate`` for validation data of any supported type.

    ``strategy``: the MultiWorkerMirroredStrategy of several workers. Keras shards NumPy data
    and Sequences across them itself (``batch_size`` is then the global batch); a
    ``tf.data.Dataset`` is this worker's shard already (``context.wrap_dataset``), so it goes
    in as a per-worker dataset: sharded again by Keras, part of it would never be evaluated."""
    if isinstance(data, SequenceAdapter):
        return {"x": data.sequence}
    if is_tf_dataset(data) and strategy is not None:
        return {"x": strategy.distribute_datasets_from_function(lambda _: data)}
    if isinstance(data, SEQUENCE_BASE) or is_tf_dataset(data):
        return {"x": data}
    arrays = _arrays(data)
    if arrays is not None:
        x, y, sw = arrays
        kwargs = {"x": x, "y": y, "batch_size": batch_size}
        if sw is not None:
            kwargs["sample_weight"] = sw
        return kwargs
    raise errors.InvalidConfig(
        f"build_validation_data_loader() returned a {type(data).__name__}. {DATA_TYPES_HELP}"
    )


__all__ = [
    "ArrayData",
    "DatasetData",
    "SequenceData",
    "TrainingData",
    "evaluate_kwargs",
    "is_tf_dataset",
    "training_data",
]
