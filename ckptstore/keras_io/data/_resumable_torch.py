"""Resumable ``torch.utils.data.DataLoader`` input for Keras 3's ``fit()`` on PyTorch.

A ``DataLoader`` draws an epoch's order when its iterator starts: ``shuffle=True``'s
``RandomSampler`` seeds a generator of its own from torch's global generator (or from the
``generator=`` it was given), and the iterator draws its workers' base seed the same way. Keras's
PyTorch loop makes one iterator per epoch, so a resumed run, whose global generator is elsewhere
by then, would read the interrupted epoch in another order. :class:`LoaderData` records the
generators' states at the start of each epoch (before its iterator draws) and saves them with the
checkpoint; the resumed run sets them back for the moment it makes the interrupted epoch's
iterator, reads the batches the checkpoint trained on (workers, if any, advance their own
generators as they did) without training on them, and puts every global generator (torch, NumPy,
Python) back where the checkpoint left it, so the rest of the epoch is bit-equal.

:func:`attach` is the PyTorch backend's (``for_running_keras()``): a ``DataLoader`` here, every
other input as on JAX (:mod:`~ckptstore.keras_io.data._resumable_jax`).

Example (what DeterminedCallback does, in ``on_train_begin``)::

    data = attach(model, seed=seed)
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from ckptstore.keras_io.data import _resumable as base
from ckptstore.keras_io.data import _resumable_jax as jax_loop
from ckptstore.keras_io.data._resumable_jax import _JaxHook

#: As on JAX: Keras's PyTorch loop builds the model and its metrics before the callbacks start.
restore_metrics = jax_loop.restore_metrics
build_from_fit_data = jax_loop.build_from_fit_data


def attach(model: Any, **options: Any) -> base.ResumableData | None:
    """:func:`ckptstore.keras_io.data._resumable.attach` (``seed``, ``distributed_size``,
    ``on_boundary``) for Keras's PyTorch fit loop."""
    return base.attach(model, adapt=_adapt, **options)


def _adapt(epoch_iterator: Any, seed: int) -> tuple[Any, str | None]:
    adapter = epoch_iterator.data_adapter
    if type(adapter).__name__ == "TorchDataLoaderAdapter":
        return make(epoch_iterator, adapter)
    return jax_loop._adapt(epoch_iterator, seed)


def make(epoch_iterator: Any, adapter: Any) -> tuple[Any, str | None]:
    """``(handle, None)`` for a ``DataLoader`` this module resumes, else ``(None, reason)``."""
    loader = adapter.get_torch_dataloader()
    if epoch_iterator.steps_per_epoch:
        return None, "a torch DataLoader with steps_per_epoch (an epoch is not one pass)"
    if adapter.num_batches is None:
        return None, "a torch DataLoader without a length (an IterableDataset)"
    return LoaderData(epoch_iterator, loader), None


def _generators(loader: Any) -> dict[str, Any]:
    """The ``torch.Generator`` objects (other than the global one) an epoch's iterator of
    ``loader`` draws from, by where they sit."""
    found: dict[str, Any] = {}
    for name, owner in (("loader", loader), ("sampler", getattr(loader, "sampler", None))):
        gen = getattr(owner, "generator", None)
        if gen is not None and all(gen is not g for g in found.values()):
            found[name] = gen
    return found


def _encode(state: Any) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> Any:
    import torch

    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


def order_states(loader: Any) -> dict[str, str]:
    """The states an epoch's order of ``loader`` is drawn from: torch's global generator and
    the loader's/sampler's own ``generator``, base64 (JSON-able)."""
    import torch

    states = {"global": _encode(torch.get_rng_state())}
    states.update({name: _encode(g.get_state()) for name, g in _generators(loader).items()})
    return states


def set_order_states(loader: Any, states: dict[str, str]) -> None:
    """Put back what :func:`order_states` recorded."""
    import torch

    torch.set_rng_state(_decode(states["global"]))
    for name, gen in _generators(loader).items():
        if name in states:
            gen.set_state(_decode(states[name]))


class LoaderData(_JaxHook, base._Base):
    """A sized ``torch.utils.data.DataLoader``: each epoch one iterator of it, as in Keras; a
    resumed epoch's iterator drawn from the states its epoch began with, fast-forwarded."""

    kind = "torch.DataLoader"

    def __init__(self, epoch_iterator: Any, loader: Any) -> None:
        self._loader = loader
        #: the order states of the running epoch, and of the epoch a checkpoint resumes
        self._epoch_states: dict[str, str] | None = None
        self._resume_states: dict[str, str] | None = None
        super().__init__(epoch_iterator, len(loader))

    def _epoch_iterator(self) -> Iterator[Any]:
        # A generator: Keras makes an iterator at each epoch's end too, for the next epoch, and
        # makes a fresh one when that epoch begins; only the one read draws.
        resumed = self._start > 0 and self._resume_states is not None
        self._epoch_states = self._resume_states if resumed else order_states(self._loader)
        self._resume_states = None
        if not resumed:
            yield from self._loader
            return
        yield from self._fast_forwarded()

    def _fast_forwarded(self) -> Iterator[Any]:
        """The resumed epoch's iterator past its first ``self._start`` batches, made and read
        from the states the epoch began with; every global generator is put back after."""
        import torch

        # The loader's own generators are left where the epoch's draws left them, as in the
        # interrupted run (reading batches draws nothing from them).
        now = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        try:
            assert self._epoch_states is not None
            set_order_states(self._loader, self._epoch_states)
            iterator = iter(self._loader)
            for _ in range(self._start):
                next(iterator)
        finally:
            torch.set_rng_state(now[0])
            np.random.set_state(now[1])
            random.setstate(now[2])
        return iterator

    def _extra(self) -> dict[str, Any]:
        return {"num_batches": self.num_batches, "order_states": self._epoch_states}

    def _restore_extra(self, state: dict[str, Any], checkpoint_dir: str) -> None:
        self._resume_states = state.get("order_states")


__all__ = [
    "LoaderData",
    "attach",
    "build_from_fit_data",
    "make",
    "order_states",
    "restore_metrics",
    "set_order_states",
]
