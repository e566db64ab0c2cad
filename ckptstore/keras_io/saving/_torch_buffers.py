"""The PyTorch snapshot's copies, made into memory that earlier snapshots used (issue 42).

PyTorch's optimizer updates the parameters in place, so a snapshot must own a copy of every
variable. A fresh ``clone()`` per checkpoint gets new memory from the allocator, and the kernel
maps it in page by page on the first write: on the 2-core test VM about 8 µs a page, 50-60 ms of
``fit()``'s time for 25 MB of weights + Adam state, against a few ms to copy the same bytes into
pages already mapped. :class:`TorchBuffers` keeps the copies of a snapshot the writer has let
go (the :class:`~ckptstore.keras_io.saving._snapshot.Snapshot` object was collected: the
writer drops it once its values are on disk) and copies the next snapshot's values into them.

A buffer is reused only when nothing but the pool refers to it (its reference count), so a
caller that kept a snapshot's values past the snapshot keeps them intact.

Example::

    pool = TorchBuffers()
    values = pool.copies([v.value for v in variables])   # training thread
    pool.release_with(snapshot)     # those copies are reused after the snapshot is gone
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

#: ``sys.getrefcount`` of a buffer just taken off the free list that nothing else refers to
#: (a numpy view of it would: ``Tensor.numpy()`` arrays keep the tensor as their base): the
#: local name and the call's argument.
_FREE_REFS = 2


class TorchBuffers:
    """Free copies by ``(shape, dtype, device)``, taken by :meth:`copies`, given back when the
    snapshot holding them is collected (:meth:`release_with`). Thread-safe (the writer thread
    drops snapshots)."""

    def __init__(self) -> None:
        self._free: dict[tuple[Any, ...], list[Any]] = {}
        self._lock = threading.Lock()
        self._last: list[Any] = []  # the last copies(), until release_with() takes them

    def copies(self, values: list[Any]) -> list[Any]:
        """A detached copy of each torch tensor of ``values``, each in a free buffer when one
        fits, else a new ``clone()``."""
        import torch

        out = []
        with torch.no_grad():
            for value in values:
                source = value.detach()
                buffer = self._take(_key(source))
                if buffer is None:
                    out.append(source.clone())
                else:
                    buffer.copy_(source)
                    out.append(buffer)
        self._last = out
        return out

    def release_with(self, owner: Any) -> None:
        """Give the last :meth:`copies` back to the pool once ``owner`` (their snapshot) is
        collected."""
        buffers, self._last = self._last, []
        weakref.finalize(owner, self._give_back, buffers)

    def _take(self, key: tuple[Any, ...]) -> Any:
        with self._lock:
            free = self._free.get(key)
            while free:
                buffer = free.pop()
                if sys.getrefcount(buffer) == _FREE_REFS:
                    return buffer
        return None

    def _give_back(self, buffers: list[Any]) -> None:
        with self._lock:
            for buffer in buffers:
                self._free.setdefault(_key(buffer), []).append(buffer)


def _key(tensor: Any) -> tuple[Any, ...]:
    return (tuple(tensor.shape), tensor.dtype, tensor.device, tensor.stride())


__all__ = ["TorchBuffers"]
