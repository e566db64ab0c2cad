"""Resumable ``torch.utils.data.DataLoader`` input for Keras 3's ``fit()`` on every backend
(Keras's ``TorchDataLoaderAdapter`` takes one on TensorFlow and JAX too).

A ``DataLoader`` draws an epoch's order when its iterator starts: ``shuffle=True``'s
``RandomSampler`` seeds a generator of its own from torch's global generator (or from the
``generator=`` it was given), and the iterator draws its workers' base seed the same way. Keras's
fit loops make one iterator per epoch, so a resumed run, whose global generator is elsewhere
by then, would read the interrupted epoch in another order. The handle :func:`make` returns
records the generators' states at the start of each epoch (before its iterator draws) and saves
them with the checkpoint; the resumed run sets them back for the moment it makes the interrupted
epoch's iterator, reads the batches the checkpoint trained on (workers, if any, advance their own
generators as they did) without training on them, and puts every global generator (torch, NumPy,
Python) back where the checkpoint left it, so the rest of the epoch is bit-equal. Torch's global
generator is in every checkpoint whenever torch is imported (``keras_io/fit/_callback_state.py``),
on any backend.

Each backend gets the epoch's batches as Keras's adapter hands them to its loop: torch tensors
on PyTorch, NumPy arrays on JAX (``get_jax_iterator``), and on TensorFlow a
``tf.data.Dataset.from_generator`` of NumPy arrays per epoch (``get_tf_dataset``, with the output
signature Keras computed from the loader's first batches).

:func:`attach` is what ``for_running_keras()`` names for Keras 3 on every backend: a ``DataLoader``
here, every other input through the backend's module (:mod:`._resumable` on TensorFlow,
:mod:`._resumable_jax` on JAX and PyTorch).

Example (what DeterminedCallback does, in ``on_train_begin``)::

    data = attach(model, seed=seed)
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from ckptstore.keras_io.data import _resumable as base
from ckptstore.keras_io.data import _resumable_jax as jax_loop
from ckptstore.keras_io.data._resumable_jax import _JaxHook


def _own() -> ModuleType:
    """The running backend's module, which resumes every input but a ``DataLoader``."""
    import keras

    return base if keras.backend.backend() == "tensorflow" else jax_loop


def attach(model: Any, **options: Any) -> base.ResumableData | None:
    """:func:`ckptstore.keras_io.data._resumable.attach` (``seed``, ``distributed_size``,
    ``on_boundary``) for Keras 3's fit loop on any backend."""
    return base.attach(model, adapt=_adapt, **options)


def _adapt(epoch_iterator: Any, seed: int) -> tuple[Any, str | None]:
    adapter = epoch_iterator.data_adapter
    if type(adapter).__name__ == "TorchDataLoaderAdapter":
        return make(epoch_iterator, adapter)
    adapt: Any = _own()._adapt
    return adapt(epoch_iterator, seed)


def build_from_fit_data(model: Any) -> None:
    """The running backend's (:func:`._resumable.build_from_fit_data` on TensorFlow)."""
    _own().build_from_fit_data(model)


#: The same on every backend.
restore_metrics = base.restore_metrics


def make(epoch_iterator: Any, adapter: Any) -> tuple[Any, str | None]:
    """``(handle, None)`` for a ``DataLoader`` this module resumes on the running backend, else
    ``(None, reason)``."""
    import keras

    loader = adapter.get_torch_dataloader()
    if epoch_iterator.steps_per_epoch:
        return None, "a torch DataLoader with steps_per_epoch (an epoch is not one pass)"
    if adapter.num_batches is None:
        return None, "a torch DataLoader without a length (an IterableDataset)"
    if keras.backend.backend() == "tensorflow":
        return _TFLoaderData(epoch_iterator, adapter), None
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


class _EpochOrder:
    """The epochs of a sized ``DataLoader`` (mixin of a :class:`base._Base`): each one iterator
    of it, as in Keras; a resumed epoch's iterator drawn from the states its epoch began with,
    fast-forwarded."""

    kind = "torch.DataLoader"
    num_batches: int
    _start: int

    def __init__(self, epoch_iterator: Any, loader: Any) -> None:
        self._loader = loader
        #: the order states of the running epoch, and of the epoch a checkpoint resumes
        self._epoch_states: dict[str, str] | None = None
        self._resume_states: dict[str, str] | None = None
        super().__init__(epoch_iterator, len(loader))  # type: ignore[call-arg]

    def _epoch_batches(self) -> Iterator[Any]:
        """The epoch's batches from ``self._start``, as the loader yields them. A generator:
        Keras makes an iterator at each epoch's end too, for the next epoch, and makes a fresh
        one when that epoch begins; only the one read draws."""
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


def _as_numpy(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches`` as NumPy arrays, as Keras's adapter converts them (``get_numpy_iterator``)."""
    from keras.src import tree

    for batch in batches:
        yield tuple(tree.map_structure(lambda x: np.asarray(x.cpu()), batch, none_is_leaf=False))


class LoaderData(_JaxHook, _EpochOrder, base._Base):
    """On PyTorch (torch tensors) and JAX (NumPy arrays, as ``get_jax_iterator``)."""

    def _epoch_iterator(self) -> Iterator[Any]:
        import keras

        if keras.backend.backend() == "torch":
            return self._epoch_batches()
        return _as_numpy(self._epoch_batches())


class _TFLoaderData(_EpochOrder, base._Base):
    """On TensorFlow: each epoch a ``from_generator`` dataset of its batches, as Keras's
    ``get_tf_dataset`` (which the fit loop already called: the output signature is known)."""

    def __init__(self, epoch_iterator: Any, adapter: Any) -> None:
        self._adapter = adapter
        super().__init__(epoch_iterator, adapter.get_torch_dataloader())

    def _epoch_iterator(self) -> Iterator[Any]:
        import tensorflow as tf

        self._adapter.get_tf_dataset()  # the output signature, if Keras has not computed it
        dataset = tf.data.Dataset.from_generator(
            lambda: _as_numpy(self._epoch_batches()),
            output_signature=self._adapter._output_signature,
        )
        return iter(self._distribute(dataset))


__all__ = [
    "LoaderData",
    "attach",
    "build_from_fit_data",
    "make",
    "order_states",
    "restore_metrics",
    "set_order_states",
]
