"""The PyTorch snapshot's copy on a background thread, and the guard that keeps it whole (issue 42).

PyTorch's optimizer writes the parameters in place, so a snapshot owns a copy of each variable
(``_torch_buffers.py``). The copy of the large variables (the weights and the optimizer's slots:
nearly all the bytes) runs on another thread (:class:`BackgroundCopy`; the pool keeps one from
``fit()``'s start) while ``fit()`` goes on with the next step's forward and backward pass; the
small ones (BatchNorm statistics, ``SeedGenerator`` states, metrics, ``iterations``, the learning
rate: the forward pass and the callbacks write those) are copied on the training thread first.

What is guaranteed: the snapshot holds every variable's value at the checkpoint, never a torn or
later one, whatever writes the variables in place afterwards through torch, from Python, on the
thread that runs ``fit()``. Until the copy is done, :class:`CopyGuard` (a ``TorchFunctionMode``
pushed on that thread) sees every such torch call, and an in-place one (a name ending in ``_``
such as ``add_``, ``copy_``, ``_foreach_mul_``, ``torch.ops.aten.add_``; ``x[...] = y``; ``+=``;
an ``out=`` or ``inplace=True`` argument) whose target shares memory with a variable being copied
waits for the copy first. That covers every optimizer's ``apply`` (a GAN's two included),
``Variable.assign`` and ``_direct_assign`` (``set_weights``, ``load_weights``, ``EarlyStopping``'s
restore, metrics, ``ReduceLROnPlateau``), a custom ``train_step``'s assigns and raw
``param.data.add_()`` alike, with no Keras method patched. A write that does not go through torch
on that thread (another thread, a NumPy view of a parameter) is outside the guard; torch's
in-place version counters, read when the snapshot is taken and again after the copy, catch one
made through torch before the copy ended: that variable is copied again until no write lands
during its copy, so it is not torn, but it holds the newer value, and a warning names it (after
three attempts the checkpoint fails with a ``CheckpointError`` instead). The writer thread waits
for the copy (:meth:`BackgroundCopy.result`) before it reads the values. With ``jit_compile=True``
(``torch.compile`` would trace the guard) the snapshot copies everything on the training thread.

The guard leaves the mode stack at the next :meth:`BackgroundCopy.settle` on the training thread
(``DeterminedCallback``'s next ``on_train_batch_end``, the next snapshot, ``fit()``'s end; after an
error inside ``fit()``, or while a mode pushed after it is still on the stack, it stays there,
inert once the copy is done, until one of those comes). The time the training thread waited
there or in the guard is :attr:`BackgroundCopy.waited` (part of what a checkpoint costs
``fit()``: ``benchmarks/backend_stall.py`` counts it).

Example::

    copy = BackgroundCopy(views, sources)  # training thread: the copy starts, the guard is on
    ...                                     # the next step; its optimizer waits if needed
    copy.settle()                           # training thread: done, guard off
    copy.result()                           # any thread: waits for the copy, raises its error
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from torch.overrides import TorchFunctionMode

from ckptstore import errors

logger = logging.getLogger(__name__)

#: Python's in-place operators and item assignment, on a tensor.
_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor")
) | {"__ilshift__", "__irshift__", "__imatmul__", "__setitem__"}
#: Attempts at a whole copy when variables change under it from outside the guard.
_ATTEMPTS = 3
#: Seconds the copier sleeps before it copies (0; tests set it so that a write right after a
#: checkpoint meets a copy still running, as a slow or busy machine would have it).
START_DELAY = 0.0


def _in_place(func: Any, kwargs: dict[str, Any] | None) -> bool:
    name = getattr(func, "__name__", "").split(".")[0]  # torch.ops: "add_.Tensor"
    if kwargs and (kwargs.get("out") is not None or kwargs.get("inplace")):
        return True
    return (name.endswith("_") and not name.startswith("__")) or name in _INPLACE_DUNDERS


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _tensors(item)]
    try:
        inner = getattr(value, "value", None)  # a Keras variable
    except Exception:  # noqa: BLE001 - some object's property: not a variable
        return []
    return [inner] if isinstance(inner, torch.Tensor) else []


def _shares(targets: list[Any], storages: set[int]) -> bool:
    for tensor in targets:
        try:
            if tensor.untyped_storage().data_ptr() in storages:
                return True
        except Exception:  # noqa: BLE001, S112 - no storage (sparse, meta): no variable's memory
            continue
    return False


class CopyGuard(TorchFunctionMode):
    """Makes an in-place torch call on memory of ``copy``'s sources wait for ``copy``."""

    def __init__(self, copy: BackgroundCopy) -> None:
        super().__init__()
        self._copy = copy

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's
        copy = self._copy
        if not copy.done.is_set() and _in_place(func, kwargs):
            targets = _tensors(args[0]) if args else []
            if kwargs and kwargs.get("out") is not None:
                targets += _tensors(kwargs["out"])
            if _shares(targets, copy.storages):
                copy.wait()
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def one_thread(torch: Any) -> Iterator[None]:
    """Run torch's ops on this thread alone: a memory copy gains nothing from a second thread
    (memory bandwidth), and when the other core is busy (the writer thread, other processes)
    the copy waits for its share (measured: 25-30 ms with two threads, 6 ms with one, load 3.5)."""
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


class BackgroundCopy:
    """``torch._foreach_copy_(views, sources)`` on another thread, guarded (module doc): on
    ``runner``'s (an executor with one thread) if given, else on a new one.

    Created on the training thread, which it pushes :class:`CopyGuard` on."""

    def __init__(self, views: list[Any], sources: list[Any], runner: Any = None) -> None:
        self.views, self.sources = views, sources
        self.storages = {s.untyped_storage().data_ptr() for s in sources}
        self._versions = [s._version for s in sources]
        self.done = threading.Event()
        self.waited = 0.0
        self._error: BaseException | None = None
        self._guard: CopyGuard | None = CopyGuard(self)
        self._guard.__enter__()
        if runner is not None:  # a thread kept for the copies: none to start (10 ms loaded)
            runner.submit(self._run)
        else:
            threading.Thread(target=self._run, name="ckptstore-torch-copy", daemon=True).start()

    def _run(self) -> None:
        import torch

        try:
            if START_DELAY:
                time.sleep(START_DELAY)
            pending = list(range(len(self.sources)))
            for _attempt in range(_ATTEMPTS):
                with torch.no_grad(), one_thread(torch):  # one core: the other trains
                    torch._foreach_copy_(
                        [self.views[i] for i in pending], [self.sources[i] for i in pending]
                    )
                pending = self._changed(pending)
                if not pending:
                    return
            raise errors.CheckpointError(
                f"{len(pending)} PyTorch variable(s) kept changing while the checkpoint copied "
                "them (in-place writes from another thread): no whole copy could be taken. "
                "Write the model's variables on the thread that runs fit()."
            )
        except BaseException as exc:  # noqa: BLE001 - the writer raises it from fit()
            self._error = exc
        finally:
            self.done.set()

    def _changed(self, indices: list[int]) -> list[int]:
        changed = [i for i in indices if self.sources[i]._version != self._versions[i]]
        for i in changed:
            logger.warning(
                "A PyTorch variable of shape %s was written in place while the checkpoint "
                "copied it, outside fit()'s thread: the checkpoint holds its newer value.",
                tuple(self.sources[i].shape),
            )
            self._versions[i] = self.sources[i]._version
        return changed

    def wait(self) -> None:
        """Wait for the copy on the training thread (the time goes to :attr:`waited`)."""
        if not self.done.is_set():
            started = time.perf_counter()
            self.done.wait()
            self.waited += time.perf_counter() - started

    def settle(self) -> None:
        """On the training thread: wait for the copy and take the guard off the mode stack
        (left there, inert, when another mode was pushed above it since; retried next time)."""
        import torch

        self.wait()
        guard = self._guard
        if guard is None:
            return
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is guard:
            guard.__exit__(None, None, None)
            self._guard = None

    @property
    def settled(self) -> bool:
        return self._guard is None

    def result(self) -> None:
        """Wait for the copy (any thread); raise what made it fail."""
        self.done.wait()
        if self._error is not None:
            raise self._error


__all__ = ["START_DELAY", "BackgroundCopy", "CopyGuard", "one_thread"]
