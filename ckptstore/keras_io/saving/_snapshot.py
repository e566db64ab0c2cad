"""Snapshot a Keras model's full training state in host/device memory, write it later.

Keras's own ``model.save()`` reads every variable, copies it into an in-memory HDF5 file, copies
that again into a zip archive, and does all of it while ``fit()`` waits. To keep training moving,
ckptstore splits the save in two:

1. :func:`take_snapshot` (foreground, fast): reads the *value* of every variable the ``.keras``
   format stores (layer weights, every optimizer slot and ``iterations``). On TensorFlow a
   variable read returns a tensor that shares the variable's buffer; the next update of that
   variable copies the buffer first (TensorFlow's copy-on-write for shared variable buffers), so
   the read is both cheap and a true point-in-time copy. On JAX the training step donates (and
   so deletes) the arrays it is given: the snapshot keeps the current arrays and gives the
   variables copies of them, which the next step donates instead. On PyTorch the optimizer
   updates the parameters in place: the snapshot holds detached copies (one memory copy, into
   memory mapped in beforehand by a background thread or left by an earlier snapshot the
   writer is done with: ``_torch_buffers.py``); the large variables' copy runs on a thread of
   its own beside the next step, and any in-place write to them on ``fit()``'s thread waits for
   it (``_torch_guard.py``; :func:`settle_buffers` ends it; a snapshot taken outside ``fit()``
   is ended by the next one or by :func:`release_buffers`).
2. :func:`write_model_archive` (background thread): writes a standard ``model.keras`` zip
   (``metadata.json``, ``config.json``, ``model.weights.h5``) from the snapshot with the same
   HDF5 layout Keras's ``saving_lib`` uses, so ``keras.models.load_model`` reads it back with
   the optimizer state intact. Each array is written once, straight into its place in the zip,
   and checksummed on the way (:mod:`ckptstore.keras_io.saving._keras_archive`); the model config is
   serialised once per layout, not per save.

The layout (which HDF5 group and key each variable goes to) is computed once per model by
:class:`StateLayout` with the same walk Keras's saver does.

Example::

    layout = StateLayout.of(model)
    snap = take_snapshot(layout)          # fast, in the training thread
    size, crc32c = write_model_archive(snap, "/tmp/ckpt/model.keras")  # in any thread
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras_archive as keras_archive
from ckptstore.keras_io.saving import _skipsets as skipsets

logger = logging.getLogger(__name__)

#: Name of the model archive inside a checkpoint (the one definition; loaders and exports use it).
MODEL_FILENAME = "model.keras"
#: The folder of a checkpoint's inference SavedModel (defined by the checkpoint format, which
#: stores it whole in place on local stores).
SAVED_MODEL_DIRNAME = fmt.SAVED_MODEL_DIRNAME


@dataclasses.dataclass
class _Entry:
    """One HDF5 dataset: ``<group>/vars/<key>``, from a variable or a fixed array."""

    group: str
    key: str
    variable: Any = None
    constant: np.ndarray | None = None


@dataclasses.dataclass
class StateLayout:
    """Where every piece of a model's state goes in ``model.weights.h5``; built once per model.

    ``groups`` keeps the order and the ``name`` attributes of HDF5 groups as Keras writes them.
    ``dynamic`` is true when some layer saved values that are not variables (they are then
    re-collected at every snapshot, in the foreground).

    Example::

        layout = StateLayout.of(model)
        print(len(layout.entries), "arrays")
    """

    model: KerasModel
    entries: list[_Entry]
    groups: dict[str, dict[str, Any] | None]
    config_json: str
    assets_dir: str | None
    dynamic: bool
    #: Why the model config could not be serialized (None: it was); the archive then holds
    #: the weights and optimizer state (what a resume needs) under a ``null`` config.
    config_error: str | None = None
    #: Each optimizer walked, with its number of variables then (see :meth:`grown`).
    optimizers: list[tuple[Any, int]] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, model: KerasModel) -> StateLayout:
        """Walk ``model`` the way ``keras.saving`` does and record its layout."""
        from keras.src.saving import serialization_lib

        config_error = None
        try:
            with serialization_lib.ObjectSharingScope():
                config_json = json.dumps(serialization_lib.serialize_keras_object(model))
        except Exception as exc:  # noqa: BLE001 - the config is best effort, weights are not
            config_json, config_error = "null", f"{type(exc).__name__}: {exc}".strip()
        recorder = _Recorder()
        assets_root = tempfile.mkdtemp(prefix="ckptstore-assets-")
        # Keras's skip sets once per type, not a throwaway Layer() per layer walked (also for a
        # run that starts without a checkpoint, whose first walk is this one); shared after it
        # for the walks that follow (the optimizer's and metrics' types met here)
        skipsets.prime(model)
        _walk(model, recorder, "", set(), assets_root)
        skipsets.share()
        if not any(os.scandir(assets_root)):
            shutil.rmtree(assets_root, ignore_errors=True)
            assets_root = None
        return cls(
            model=model,
            entries=recorder.entries,
            groups=recorder.groups,
            config_json=config_json,
            assets_dir=assets_root,
            dynamic=recorder.dynamic,
            config_error=config_error,
            optimizers=recorder.optimizers,
        )

    def grown(self) -> bool:
        """Whether an optimizer has built variables since the walk (a GAN's own optimizers
        build at their first step, after ``fit()`` began): the layout then lacks their slots."""
        return any(len(opt.variables) != count for opt, count in self.optimizers)

    def close(self) -> None:
        """Remove the temporary assets copy, if any."""
        if self.assets_dir:
            shutil.rmtree(self.assets_dir, ignore_errors=True)
            self.assets_dir = None


@dataclasses.dataclass
class Snapshot:
    """Point-in-time values of every entry of a :class:`StateLayout`."""

    layout: StateLayout
    values: list[Any]
    #: PyTorch: the background copy that fills ``values`` (``_torch_guard.py``); None when
    #: they are final already. Readers call :meth:`wait` first.
    pending: Any = None

    def wait(self) -> None:
        """Wait until :attr:`values` hold the snapshot (PyTorch's background copy is done)."""
        if self.pending is not None:
            self.pending.result()

    @property
    def nbytes(self) -> int:
        """Total size of the snapshot's arrays in bytes."""
        total = 0
        for value in self.values:
            size = getattr(value, "nbytes", None)
            if size is None:
                shape = getattr(value, "shape", ())
                itemsize = np.dtype(str(getattr(value, "dtype", "float32").name)).itemsize
                size = int(np.prod(shape)) * itemsize
            total += int(size)
        return total


class _Recorder:
    """Collects what ``save_own_variables`` would write, without writing anything."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.groups: dict[str, dict[str, Any] | None] = {}
        self.dynamic = False
        self.optimizers: list[tuple[Any, int]] = []
        self._path = ""
        self._metadata: dict[str, Any] | None = None

    def make(self, path: str, metadata: dict[str, Any] | None = None) -> _Recorder:
        self._path = path
        self._metadata = metadata
        if metadata:
            self.groups.setdefault(path, metadata)
        return self

    def __setitem__(self, key: str, value: Any) -> None:
        self.groups.setdefault(self._path, self._metadata)
        if _is_variable(value):
            self.entries.append(_Entry(self._path, str(key), variable=value))
        else:
            self.dynamic = True
            array = np.array(value)
            if array.dtype == object:  # h5py would fail in the writer thread, at the end
                name = (self._metadata or {}).get("name") or self._path or "the model"
                raise errors.CheckpointError(
                    f"Layer {name!r} (at {self._path or '/'!r}) saves {key!r} = "
                    f"{type(value).__name__}, which is not an array: no checkpoint of this "
                    "model can be written. Make its save_own_variables() store arrays or "
                    "variables only (keep Python objects such as generators out of it)."
                )
            self.entries.append(_Entry(self._path, str(key), constant=array))

    def add_variables(self, variables: list[Any]) -> None:
        for i, variable in enumerate(variables):
            self[str(i)] = variable


def _is_variable(value: Any) -> bool:
    from keras import Variable

    return isinstance(value, Variable)


def _walk(saveable: Any, store: _Recorder, inner_path: str, visited: set[int], assets: str) -> None:
    """Mirror of ``keras.src.saving.saving_lib._save_state`` that records instead of writing.

    Optimizers save ``variable.numpy()`` copies; here they are recorded as the variables
    themselves so the snapshot can read them cheaply later.
    """
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.saving import saving_lib
    from keras.src.saving.keras_saveable import KerasSaveable

    if id(saveable) in visited:
        return
    if hasattr(saveable, "save_own_variables"):
        name = getattr(saveable, "name", None)
        metadata = {"name": name} if isinstance(name, str) else None
        store.make(inner_path, metadata=metadata)
        if isinstance(saveable, BaseOptimizer):
            variables = list(saveable.variables)
            store.optimizers.append((saveable, len(variables)))
            store.add_variables(variables)
        else:
            saveable.save_own_variables(store)
    if hasattr(saveable, "save_assets"):
        target = os.path.join(assets, inner_path) if inner_path else assets
        os.makedirs(target, exist_ok=True)
        saveable.save_assets(target)
        if not any(os.scandir(target)) and target != assets:
            os.rmdir(target)
    visited.add(id(saveable))

    for child_attr, child in saving_lib._walk_saveable(saveable):
        child_path = f"{inner_path}/{child_attr}" if inner_path else child_attr
        if isinstance(child, KerasSaveable):
            _walk(child, store, child_path, visited, assets)
        elif isinstance(child, (list, dict, tuple)):
            _walk_container(child, store, child_path, visited, assets, set())


def _walk_container(
    container: Any,
    store: _Recorder,
    inner_path: str,
    visited: set[int],
    assets: str,
    visited_containers: set[int],
) -> None:
    from keras.src.saving import saving_lib
    from keras.src.saving.keras_saveable import KerasSaveable
    from keras.src.utils import naming

    if id(container) in visited_containers:
        return
    visited_containers.add(id(container))
    used_names: dict[str, int] = {}
    items = list(container.values()) if isinstance(container, dict) else container
    for item in items:
        if isinstance(item, KerasSaveable):
            name = saving_lib._get_unique_name(
                naming.to_snake_case(item.__class__.__name__), used_names
            )
            _walk(item, store, f"{inner_path}/{name}", visited, assets)
        elif isinstance(item, (list, dict, tuple)):
            name = saving_lib._get_unique_name("container", used_names)
            _walk_container(
                item, store, f"{inner_path}/{name}", visited, assets, visited_containers
            )


def _read_value(variable: Any) -> Any:
    """A point-in-time value of ``variable`` that later updates cannot change (TensorFlow and
    other backends; JAX and PyTorch values are read in one batch: :func:`_jax_copies`,
    :class:`~ckptstore.keras_io.saving._torch_buffers.TorchBuffers`)."""
    import keras

    backend = keras.backend.backend()
    value = variable.value
    if backend == "tensorflow":
        read = getattr(value, "read_value", None)
        if read is not None:
            return read()
        import tensorflow as tf

        return tf.identity(value)
    return keras.ops.copy(value)


def _jax_copies(model: Any, variables: list[Any]) -> list[Any]:
    """The JAX ``variables``' current values, owned by the snapshot: no training step will
    donate them, and no copy needs to finish before another thread reads them.

    During ``fit()`` on JAX the current values live in the trainer's state, not in the
    variables: ``jax_state_sync()`` puts them back (what ``Callback.model`` does for Keras's own
    savers). Those arrays would be *donated* to (deleted by) the next training step, so the
    variables are given copies of them (one asynchronous device batch, ``may_alias=False``) and
    the snapshot keeps the originals. After any sync Keras's JAX trainer takes its next state
    from the variables (``_jax_state_synced``): the next step donates the copies, never the
    snapshot's arrays. The writer thread reads the originals as soon as the step that made them
    is done; it does not wait for the copies (on JAX CPU the copy of 50 MB took 40-70 ms to
    land, all of it waited for by the writer when the snapshot held the copies).
    """
    import jax

    sync = getattr(model, "jax_state_sync", None)
    if callable(sync):
        sync()
    originals = [v.value for v in variables]
    for variable, copy in zip(variables, jax.device_put(originals, may_alias=False), strict=True):
        variable.assign(copy)
    return originals


def _read_values(layout: StateLayout) -> list[Any]:
    import keras

    if keras.backend.backend() == "torch":
        variables = [e.variable.value for e in layout.entries if e.variable is not None]
        # torch.compile'd steps (jit_compile=True) would trace the guard: copied here then
        overlap = getattr(layout.model, "jit_compile", False) is not True
        copies = iter(_torch_buffers(layout).copies(variables, overlap=overlap))
        return [next(copies) if e.variable is not None else e.constant for e in layout.entries]
    if keras.backend.backend() != "jax":
        return [
            _read_value(e.variable) if e.variable is not None else e.constant
            for e in layout.entries
        ]
    variables = [e.variable for e in layout.entries if e.variable is not None]
    copies = iter(_jax_copies(layout.model, variables))
    return [next(copies) if e.variable is not None else e.constant for e in layout.entries]


def take_snapshot(layout: StateLayout) -> Snapshot:
    """Read every variable of ``layout`` now (cheap; see the module docstring)."""
    if layout.dynamic or layout.grown():
        # Some layer saves non-variable state, or an optimizer built its slots since the walk:
        # re-record it so constants are current and every slot is saved.
        fresh = StateLayout.of(layout.model)
        layout.close()
        layout.entries, layout.groups, layout.assets_dir, layout.optimizers = (
            fresh.entries,
            fresh.groups,
            fresh.assets_dir,
            fresh.optimizers,
        )
    # a copy of the layout's fields: a later re-record must not change what this one writes
    snapshot = Snapshot(layout=dataclasses.replace(layout), values=_read_values(layout))
    pool = layout.__dict__.get(_TORCH_BUFFERS)
    if pool is not None:  # torch: the copies go back to the pool once the writer let go
        snapshot.pending = pool.in_flight
        pool.release_with(snapshot)
    return snapshot


#: The attribute of a (torch) :class:`StateLayout` holding its snapshots' reusable copies; not a
#: field, so the layout copy each snapshot carries does not share it.
_TORCH_BUFFERS = "_torch_buffers"


def _torch_buffers(layout: StateLayout) -> Any:
    from ckptstore.keras_io.saving._torch_buffers import TorchBuffers

    return layout.__dict__.setdefault(_TORCH_BUFFERS, TorchBuffers())


def prepare_buffers(layout: Any) -> None:
    """On PyTorch, have the memory of ``layout``'s next snapshot mapped in by a background
    thread (``fit()``'s start: the first checkpoint's copy then needs no page faults)."""
    import keras

    if isinstance(layout, StateLayout) and keras.backend.backend() == "torch":
        variables = [e.variable.value for e in layout.entries if e.variable is not None]
        _torch_buffers(layout).prepare(variables)


def settle_buffers(layout: Any) -> None:
    """On PyTorch, on the training thread: end the last snapshot's background copy (waiting
    for it if it is still running) and take its guard off (``_torch_guard.py``). Cheap when
    there is none: ``DeterminedCallback`` calls it after every batch."""
    pool = getattr(layout, "__dict__", {}).get(_TORCH_BUFFERS)
    if pool is not None and pool.in_flight is not None:
        pool.settle()


def release_buffers(layout: Any) -> None:
    """Let the memory :func:`prepare_buffers` and the snapshots kept go (``fit()``'s end)."""
    pool = getattr(layout, "__dict__", {}).get(_TORCH_BUFFERS)
    if pool is not None:
        pool.close()


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)  # zero-copy for host tensors
    except Exception:  # noqa: BLE001 - fall back to Keras's converter (e.g. GPU tensors)
        from keras import ops

        return ops.convert_to_numpy(value)


def _weight_groups(
    snapshot: Snapshot, hold: set[int] | None = None
) -> list[keras_archive.WeightGroup]:
    """``model.weights.h5``'s groups and datasets for ``snapshot``, in Keras's order.
    ``hold`` (a set, if given) receives the ``id()`` of the arrays of frozen model variables
    a :class:`~ckptstore.keras_io.saving._keras_archive.WriteMemo` may keep (TensorFlow only:
    its reads share the variable's buffer; other backends' snapshots are copies)."""
    snapshot.wait()
    layout = snapshot.layout
    frozen = _frozen_variables(layout) if hold is not None else set()
    by_group: dict[str, list[tuple[str, Any]]] = {}
    for entry, value in zip(layout.entries, snapshot.values, strict=True):
        array = _to_numpy(value)
        if id(entry.variable) in frozen:
            hold.add(id(array))  # type: ignore[union-attr]
        by_group.setdefault(entry.group, []).append((entry.key, array))
    return [
        keras_archive.WeightGroup(
            path=f"{group_path}/vars" if group_path else "vars",
            attrs=metadata,
            datasets=by_group.get(group_path, []),
        )
        for group_path, metadata in layout.groups.items()
    ]


def _frozen_variables(layout: StateLayout) -> set[int]:
    """``id()`` of the model's non-trainable variables that are no optimizer's (a frozen
    backbone; BatchNorm statistics too, which change but are small), on TensorFlow."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return set()
    slots = {id(v) for opt, _n in layout.optimizers for v in opt.variables}
    return {
        id(e.variable)
        for e in layout.entries
        if e.variable is not None
        and not getattr(e.variable, "trainable", True)
        and id(e.variable) not in slots
    }


def _assets(layout: StateLayout) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if layout.assets_dir:
        for root, _dirs, files in os.walk(layout.assets_dir):
            for name in sorted(files):
                full = os.path.join(root, name)
                rel = os.path.relpath(full, layout.assets_dir).replace(os.sep, "/")
                found.append((rel, full))
    return found


def write_model_archive(
    snapshot: Snapshot,
    path: str,
    *,
    cuts: list[int] | None = None,
    split: int | None = None,
    blob_dir: str | None = None,
    memo: keras_archive.WriteMemo | None = None,
) -> tuple[int, str]:
    """Write ``snapshot`` as a standard ``.keras`` zip at ``path`` in one pass over the data.

    Returns ``(size in bytes, CRC-32C of the file as 8 hex digits)`` (the checksum a checkpoint
    manifest records, so the file need not be read again). ``cuts`` (a list, if given)
    receives the offsets where each tensor's bytes begin and end (for deduplicated uploads);
    ``split`` (a chunk size) writes the file as its chunks' part files (write-once local
    deduplicated commits); with it, ``blob_dir`` and ``memo``, frozen arrays unchanged since
    the last write are taken from their stored blobs. See
    :mod:`ckptstore.keras_io.saving._keras_archive`.
    """
    hold: set[int] = set()
    return keras_archive.write_archive(
        path,
        _weight_groups(snapshot, hold if memo is not None else None),
        config_json=snapshot.layout.config_json,
        assets=_assets(snapshot.layout),
        cuts=cuts,
        split=split,
        blob_dir=blob_dir,
        memo=memo,
        hold=hold,
    )


def write_keras_archive(snapshot: Snapshot, path: str, *, scratch_dir: str | None = None) -> int:
    """Write ``snapshot`` as a standard ``.keras`` zip at ``path``; returns its size in bytes.

    ``scratch_dir`` is accepted for compatibility and unused (nothing temporary is written).
    """
    del scratch_dir
    size, _crc32c = write_model_archive(snapshot, path)
    return size
