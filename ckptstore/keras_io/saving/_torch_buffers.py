"""The PyTorch snapshot's copies, made into memory mapped in before the checkpoint (issue 42).

PyTorch's optimizer updates the parameters in place, so a snapshot must own a copy of every
variable. A fresh ``clone()`` per checkpoint gets new memory from the allocator, and the kernel
maps it in page by page on the first write: on the 2-core test VM about 8 µs a page, 50-60 ms of
``fit()``'s time for 25 MB of weights + Adam state, against a few ms to copy the same bytes into
pages already mapped.

:class:`TorchBuffers` is a bounded pool of *buffer sets*: one flat allocation per set, holding a
view per variable, its pages touched once. The training thread copies a snapshot's values into
a free set: the variables smaller than :data:`OVERLAP_BYTES` in one call
(``torch._foreach_copy_``: one release of the GIL, not one per tensor, which matters while the
writer thread holds it) on one intra-op thread (``_torch_guard.one_thread``); the large ones
(weights, optimizer slots: nearly all the bytes) on a guarded background thread beside the next
training step (``_torch_guard.py`` says what is guaranteed), ended by
:meth:`TorchBuffers.settle`. A set goes back to the pool when its snapshot is collected (the
writer drops it once its values are on disk) and nothing else still refers to its memory (a
NumPy array of a view, for instance: the storage's use count is checked). Spare sets are
allocated and touched on that background thread (one, kept from ``fit()``'s start: a
thread started per checkpoint cost 10 ms at load 5), ahead of the checkpoint that needs them:
one at :meth:`TorchBuffers.prepare` (``fit()``'s start), another whenever the pool runs out.
There are at most :data:`SETS` pooled sets: the writer holds at most two snapshots (one written,
one queued: ``_writer.py``), so with three the training thread finds a mapped set; a snapshot
taken while all are held gets fresh memory that is not kept. :meth:`TorchBuffers.close`
(``fit()``'s end) lets the pool's memory go.

Example::

    pool = TorchBuffers()
    pool.prepare([v.value for v in variables])  # a spare set, touched in the background
    values = pool.copies([v.value for v in variables])  # training thread; copy in flight
    pool.release_with(snapshot)  # the set is reused once the snapshot is gone
    pool.settle()  # training thread, later: the copy is done, its guard off
    pool.close()
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: Pooled buffer sets: the writer's two snapshots in flight (one written, one queued) + one.
SETS = 3
#: Variables of this many bytes or more are copied in the background (``_torch_guard.py``).
OVERLAP_BYTES = 1 << 16
#: Byte alignment of each variable's view in a set's flat buffer.
_ALIGN = 64
#: ``CKPTSTORE_TORCH_POOL=0`` turns the pool off (a ``clone()`` per variable: A/B benchmarks).
_ENV = "CKPTSTORE_TORCH_POOL"
#: ``CKPTSTORE_TORCH_OVERLAP=0``: every copy on the training thread (no background copy: A/B).
_OVERLAP_ENV = "CKPTSTORE_TORCH_OVERLAP"


class _Set:
    """One flat CPU buffer and a view of it per variable (``signature``: shapes and dtypes)."""

    def __init__(self, signature: tuple[Any, ...], pooled: bool) -> None:
        import torch

        self.signature = signature
        self.pooled = pooled
        offsets, total = [], 0
        for shape, dtype in signature:
            offsets.append(total)
            nbytes = math.prod(shape) * dtype.itemsize
            total += -(-nbytes // _ALIGN) * _ALIGN
        self.flat = torch.empty(max(total, 1), dtype=torch.uint8)
        self.views = [
            self.flat[start : start + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for start, (shape, dtype) in zip(offsets, signature, strict=True)
        ]
        # what refers to the memory with nothing else holding it: the flat buffer and the views
        # (other tensors of it, e.g. a NumPy array's base), and this set's list (the views)
        self._uses, self._refs = _storage_uses(self.flat), self._view_refs()

    def touch(self) -> _Set:
        """Map every page in now (the first write faults them in)."""
        self.flat.zero_()
        return self

    def unshared(self) -> bool:
        """Whether nothing outside this set refers to its memory (views, NumPy arrays)."""
        return _storage_uses(self.flat) == self._uses and self._view_refs() == self._refs

    def _view_refs(self) -> list[int]:
        return [sys.getrefcount(view) for view in self.views]


class TorchBuffers:
    """A bounded pool of :class:`_Set`\\ s (see the module docstring). Thread-safe: the writer
    thread drops snapshots, a background thread adds spare sets."""

    def __init__(self, sets: int = SETS) -> None:
        self._limit = sets
        self._free: list[_Set] = []
        self._pooled = 0  # pooled sets alive: free, held by snapshots or being touched
        self._lock = threading.Lock()
        self._spare: Future[None] | None = None
        self._closed = False
        self._last: _Set | None = None  # the last copies(), until release_with() takes it
        self.enabled = os.environ.get(_ENV, "1") != "0"
        self.overlap = os.environ.get(_OVERLAP_ENV, "1") != "0"
        self._copier: ThreadPoolExecutor | None = None
        #: The last snapshot's guarded background copy, until :meth:`settle` ends it.
        self.in_flight: Any = None
        #: Seconds the training thread waited for each background copy (guard and settle).
        self.waits: list[float] = []

    def prepare(self, values: list[Any]) -> None:
        """Open the pool (again) and have a set for ``values`` touched in the background, and
        the thread of the background copies started."""
        self._closed = False
        signature = _signature(values)
        if self.enabled and signature is not None:
            self._start_spare(signature)
            self._runner()

    def _runner(self) -> ThreadPoolExecutor:
        """The one thread the background copies run on, started once (a thread started per
        checkpoint cost ``fit()`` 10 ms at load 5: ``Thread.start`` waits for it to run)."""
        with self._lock:
            if self._copier is None:
                self._copier = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-torch-copy")
                self._copier.submit(int)  # its thread starts now, not at the first checkpoint
            return self._copier

    def copies(self, values: list[Any], overlap: bool = True) -> list[Any]:
        """A detached copy of each torch tensor of ``values``, in a free set when there is one.

        With ``overlap``, the copies of the variables of :data:`OVERLAP_BYTES` or more are made
        by a guarded background copy (``_torch_guard.py``) that is :attr:`in_flight` until
        :meth:`settle`; the others are copied here."""
        import torch

        self.settle()  # an earlier snapshot's copy, if any, ends first
        sources = [value.detach() for value in values]
        signature = _signature(sources) if self.enabled else None
        if signature is None:  # not all on the CPU, or the pool is off
            self._last = None
            with torch.no_grad():
                return [source.clone() for source in sources]
        chosen = self._take(signature)
        overlap = overlap and self.overlap
        large = [overlap and s.numel() * s.element_size() >= OVERLAP_BYTES for s in sources]
        now = [(v, s) for v, s, big in zip(chosen.views, sources, large, strict=True) if not big]
        from ckptstore.keras_io.saving._torch_guard import BackgroundCopy, one_thread

        with torch.no_grad(), one_thread(torch):
            if now:
                torch._foreach_copy_([v for v, _s in now], [s for _v, s in now])
        if any(large):
            pairs = [(v, s) for v, s, big in zip(chosen.views, sources, large, strict=True) if big]
            self.in_flight = BackgroundCopy(
                [v for v, _s in pairs], [s for _v, s in pairs], self._runner()
            )
        self._last = chosen
        if not self._free:
            self._start_spare(signature)
        return list(chosen.views)

    def settle(self) -> None:
        """On the training thread: wait for the background copy in flight, if any, and take
        its guard off (:meth:`~ckptstore.keras_io.saving._torch_guard.BackgroundCopy.settle`);
        the seconds waited go to :attr:`waits`."""
        copy = self.in_flight
        if copy is None:
            return
        copy.settle()
        if copy.settled:
            self.in_flight = None
            self.waits.append(copy.waited)

    def release_with(self, owner: Any) -> None:
        """Give the last :meth:`copies`' set back to the pool once ``owner`` (their snapshot)
        is collected."""
        chosen, self._last = self._last, None
        if chosen is not None:
            weakref.finalize(owner, self._give_back, chosen)

    def close(self) -> None:
        """End the copy in flight (:meth:`settle`; on the training thread) and let the free
        sets go; sets still held are dropped when given back."""
        self.settle()
        with self._lock:
            if self._copier is not None:
                self._copier.shutdown(wait=False)  # after a spare being touched, if any
                self._copier = None
            self._closed = True
            self._pooled -= len(self._free)
            self._free.clear()

    # ---- internals --------------------------------------------------------------------------
    def _take(self, signature: tuple[Any, ...]) -> _Set:
        with self._lock:
            # sets of an older layout (an optimizer built more slots since) go
            stale = [s for s in self._free if s.signature != signature]
            self._free = [s for s in self._free if s.signature == signature]
            self._pooled -= len(stale)
            for i, candidate in enumerate(self._free):
                if candidate.unshared():
                    return self._free.pop(i)
            pooled = not self._closed and self._pooled < self._limit
            if pooled:
                self._pooled += 1
        return _Set(signature, pooled)  # fresh memory: its pages fault in on the copy

    def _start_spare(self, signature: tuple[Any, ...]) -> None:
        with self._lock:
            busy = self._spare is not None and not self._spare.done()
            if busy or self._closed or self._pooled >= self._limit:
                return
            self._pooled += 1
        # on the copies' thread, after any copy queued there
        self._spare = self._runner().submit(self._make_spare, signature)

    def _make_spare(self, signature: tuple[Any, ...]) -> None:
        try:
            spare = _Set(signature, pooled=True).touch()
        except BaseException:  # noqa: BLE001 - out of memory: the next snapshot clones
            with self._lock:
                self._pooled -= 1
            return
        self._give_back(spare)

    def _give_back(self, chosen: _Set) -> None:
        if not chosen.pooled:
            return
        with self._lock:
            if self._closed:
                self._pooled -= 1
            else:
                self._free.append(chosen)


def _signature(values: list[Any]) -> tuple[Any, ...] | None:
    """``values``' shapes and dtypes, or None when one is not a CPU tensor."""
    if any(getattr(v, "device", None) is None or v.device.type != "cpu" for v in values):
        return None
    return tuple((tuple(v.shape), v.dtype) for v in values)


def _storage_uses(tensor: Any) -> int:
    import torch

    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


__all__ = ["OVERLAP_BYTES", "SETS", "TorchBuffers"]
