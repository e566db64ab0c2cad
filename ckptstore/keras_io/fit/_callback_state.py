"""The training state a checkpoint keeps besides the model: ``callback_state.json``.

Everything here is JSON (never pickle): the epoch, ``steps_completed``, ``continue_id``, the
state of every stateful callback in the ``fit()`` list (``get_state()``/``load_state()``), RNG
states (Python ``random``, NumPy, TensorFlow's global generator, Keras's global seed generator)
model variables that the ``.keras`` format leaves out (e.g. ``SeedGenerator`` states of
``Dropout`` layers), so a resumed run draws the same random numbers, and the carried states of
stateful RNN layers.

Example::

    state = TrainingState(epoch=3, steps_completed=120, continue_id=7)
    write_state("/tmp/ckpt", state)
    assert read_state("/tmp/ckpt").epoch == 3
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import random
import sys
from typing import Any

import numpy as np

from ckptstore import errors
from ckptstore.checkpointing.jsonfiles import load_json
from ckptstore.keras_io._types import KerasModel
from ckptstore.validators import is_int, is_number

logger = logging.getLogger(__name__)

#: File name of the training state inside a checkpoint.
STATE_FILENAME = "callback_state.json"
STATE_VERSION = 1


@dataclasses.dataclass
class TrainingState:
    """What :class:`~ckptstore.keras_io.fit._callback.DeterminedCallback` needs to resume exactly.

    ``epoch`` is the number of *completed* epochs (the epoch to start from on resume).
    ``epoch_complete`` is false when training was preempted in the middle of an epoch; the
    resumed run continues that epoch at ``data["batch"]`` when ``data`` says where (else the
    epoch restarts from its first batch).
    """

    epoch: int = 0
    steps_completed: int = 0
    continue_id: Any = None
    epoch_complete: bool = True
    callbacks: dict[str, Any] = dataclasses.field(default_factory=dict)
    rng: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_variables: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Where in the input the next batch comes from (see ``resumable_data``), or None.
    data: dict[str, Any] | None = None
    #: Values of ``model.metrics_variables`` at a mid-epoch save (the epoch's accumulators).
    metrics_variables: list[Any] | None = None
    #: Carried states of stateful RNN layers (:mod:`~ckptstore.keras_io.saving._layer_states`;
    #: arrays in ``callback_arrays.npz``), or None for a model without any.
    layer_states: list[Any] | None = None
    #: Which ``fit()`` call of the script wrote it (0: the first; a script may call ``fit()``
    #: several times with one callback, e.g. fine-tuning after transfer learning).
    fit_call: int = 0
    #: ``History`` of each earlier ``fit()`` call that finished (epoch and history lists): a
    #: re-run that passes such a call gives it back its ``History``.
    fit_histories: list[Any] | None = None
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return self.to_json_with_cuts()[0]

    def to_json_with_cuts(self) -> tuple[str, list[int]]:
        """The JSON text (the same bytes ``json.dumps`` gives) and the offsets where each
        top-level value and each value of a top-level object (``rng``'s generators,
        ``callbacks``, ``extra_variables``) begins and ends. A deduplicated commit cuts the
        file there, so parts that did not change since the last checkpoint (RNG states a
        training run does not draw from) are chunks already in storage. ASCII only, so
        character offsets are byte offsets."""
        try:
            # One level, not dataclasses.asdict: its deep copy of the RNG states (~1250 ints)
            # cost more than the JSON itself, on the training thread at every save.
            return _dumps_with_cuts(
                {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            )
        except (TypeError, ValueError) as exc:
            raise errors.CheckpointError(
                f"The training state could not be written as JSON: {exc}. Every stateful "
                "callback's get_state() must return JSON-able values (dicts, lists, str, "
                "numbers, bools, None)."
            ) from exc

    @classmethod
    def from_json(cls, text: str) -> TrainingState:
        # Bounded (size, depth): a hostile file raises InvalidCheckpoint, not RecursionError.
        raw = load_json(text, STATE_FILENAME, MAX_STATE_BYTES)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in _checked(raw).items() if k in known})


#: The largest ``callback_state.json`` read (callbacks' arrays live in their own ``.npz``).
MAX_STATE_BYTES = 64 * 2**20
#: Counters fit a signed 64-bit column (the registry's) and TensorFlow's int64 step variables.
_MAX_COUNT = 2**63 - 1
#: Value types of the optional fields (``None`` allowed where the default is None).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "epoch_complete": (bool,),
    "callbacks": (dict,),
    "rng": (dict,),
    "extra_variables": (dict,),
    "data": (dict, type(None)),
    "metrics_variables": (list, type(None)),
    "layer_states": (list, type(None)),
    "fit_histories": (list, type(None)),
}  # continue_id: any JSON (DeterminedCallback takes any JSON-able value; only compared with ==)


def _bad_state(what: str, value: Any) -> errors.InvalidCheckpoint:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return errors.InvalidCheckpoint(
        f"{STATE_FILENAME} is malformed: {what}; nothing of it was applied. The checkpoint is "
        f"damaged or was not written by ckptstore: resume from another checkpoint (or pass "
        f"checkpoint=None). Received: {shown}."
    )


def _checked(raw: Any) -> dict[str, Any]:
    """``raw`` (a decoded ``callback_state.json``) if every value has the type and range the
    resume code applies it with; else InvalidCheckpoint naming the first bad value. Checked
    whole before any value is used, so a bad file never leaves a half-restored run."""
    if not isinstance(raw, dict):
        raise _bad_state("it must hold a JSON object", raw)
    for name in ("epoch", "steps_completed", "version"):
        if name not in raw:
            raise _bad_state(f"the key {name!r} is missing", sorted(raw)[:10])
        value = raw[name]
        minimum = 1 if name == "version" else 0
        maximum = STATE_VERSION if name == "version" else _MAX_COUNT
        if not is_int(value) or not minimum <= value <= maximum:
            raise _bad_state(f"{name} must be an integer from {minimum} to {maximum}", value)
    for name, types in _FIELD_TYPES.items():
        if name in raw and not isinstance(raw[name], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _bad_state(f"{name} must be {wanted}", raw[name])
    fit_call = raw.get("fit_call", 0)
    if not is_int(fit_call) or not 0 <= fit_call <= _MAX_COUNT:
        raise _bad_state(f"fit_call must be an integer from 0 to {_MAX_COUNT}", fit_call)
    _check_rng(raw.get("rng") or {})
    return raw


def _int_list(value: Any, length: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(is_int(v) and -_MAX_COUNT - 1 <= v <= 2**64 - 1 for v in value)
    )


def _check_rng(rng: dict[str, Any]) -> None:
    """The shapes :func:`restore_rng` hands to ``random.setstate`` / ``np.random.set_state``
    / TensorFlow and Keras generators (each would fail half-way, or worse, accept nonsense)."""
    python, numpy_state = rng.get("python"), rng.get("numpy")
    if python is not None and not (
        isinstance(python, list)
        and len(python) == 3
        and is_int(python[0])
        and _int_list(python[1], 625)
        and (python[2] is None or is_number(python[2]))
    ):
        raise _bad_state("rng.python must be [version, 625 integers, gauss]", python)
    if numpy_state is not None and not (
        isinstance(numpy_state, list)
        and len(numpy_state) == 5
        and numpy_state[0] == "MT19937"
        and _int_list(numpy_state[1], 624)
        and all(is_int(v) for v in numpy_state[2:4])
        and is_number(numpy_state[4])
    ):
        raise _bad_state(
            "rng.numpy must be ['MT19937', 624 integers, pos, has_gauss, x]", numpy_state
        )
    tf_state = rng.get("tensorflow")
    if tf_state is not None and not (
        isinstance(tf_state, dict)
        # Philox keeps 3 integers, ThreeFry 2
        and (_int_list(tf_state.get("state"), 3) or _int_list(tf_state.get("state"), 2))
        and is_int(tf_state.get("algorithm"))
    ):
        raise _bad_state(
            "rng.tensorflow must be {'state': [2 or 3 integers], 'algorithm': int}", tf_state
        )
    torch_state = rng.get("torch")
    if torch_state is not None and not _torch_rng_state(torch_state):
        raise _bad_state(
            f"rng.torch must be torch.get_rng_state() ({TORCH_RNG_BYTES} bytes) in base64",
            torch_state,
        )
    seed = rng.get("keras_global_seed")
    if seed is not None and not _int_list(seed, 2):  # a SeedGenerator's state: 2 integers
        raise _bad_state("rng.keras_global_seed must be a list of 2 integers", seed)


#: Size of ``torch.get_rng_state()`` on CPU: the MT19937 generator's state.
TORCH_RNG_BYTES = 5056


def _torch_rng_state(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return len(base64.b64decode(value, validate=True)) == TORCH_RNG_BYTES
    except ValueError:  # binascii.Error
        return False


def _dumps_with_cuts(doc: dict[str, Any]) -> tuple[str, list[int]]:
    parts: list[str] = []
    cuts: list[int] = []
    size = 0

    def put(text: str, *, cut: bool = False) -> None:
        nonlocal size
        if cut:
            cuts.append(size)
        parts.append(text)
        size += len(text)
        if cut:
            cuts.append(size)

    def obj(value: dict[str, Any], *, depth: int) -> None:
        put("{")
        for i, (key, item) in enumerate(value.items()):
            put((", " if i else "") + json.dumps(key) + ": ")
            # An object with keys json.dumps would coerce (ints, None) is left whole.
            if depth == 0 and isinstance(item, dict) and item and all(map(_is_str, item)):
                obj(item, depth=1)
            else:
                put(json.dumps(item, default=_json_default), cut=True)
        put("}")

    if not all(map(_is_str, doc)):
        return json.dumps(doc, default=_json_default), []
    obj(doc, depth=0)
    return "".join(parts), cuts


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)  # a callback state holding a dataclass, as before
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy()).tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_state(ckpt_dir: str, state: TrainingState) -> None:
    """Write ``callback_state.json`` into ``ckpt_dir``."""
    with open(os.path.join(ckpt_dir, STATE_FILENAME), "w", encoding="utf-8") as f:
        f.write(state.to_json())


def read_state(ckpt_dir: str) -> TrainingState | None:
    """The state in ``ckpt_dir``, or None when the checkpoint has none (weights only)."""
    path = os.path.join(ckpt_dir, STATE_FILENAME)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise _bad_state(f"it is larger than {MAX_STATE_BYTES} bytes", os.path.getsize(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidCheckpoint(
            f"{STATE_FILENAME} is not UTF-8 JSON ({exc}); it was not read (a pickle or a "
            "damaged file). Resume from another checkpoint."
        ) from None
    return TrainingState.from_json(text)


# ---- RNG ----------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """The state of every global random generator we know of, as JSON-able data (TensorFlow's
    global ``tf.random.Generator`` once something created it)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    rng: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if "tensorflow" in sys.modules:
        try:
            from tensorflow.python.ops import stateful_random_ops

            # Only a generator that exists: get_global_generator() creates one (25-280 ms of
            # the first save), and none existing means nothing drew from it yet.
            gen = stateful_random_ops.global_generator
            if gen is not None:
                rng["tensorflow"] = {
                    "state": gen.state.numpy().tolist(),
                    "algorithm": int(gen.algorithm),
                }
        except Exception as exc:  # noqa: BLE001 - best effort, logged
            logger.debug("TensorFlow global generator state not captured: %s", exc)
    gen = _keras_global_seed_generator()
    if gen is not None:
        rng["keras_global_seed"] = np.asarray(gen.state.numpy()).tolist()
    if "torch" in sys.modules:
        # Keras's Dropout without a seed draws from torch's global CPU generator on PyTorch
        # (torch.nn.functional.dropout): its MT19937 state, 5056 bytes, base64.
        import torch

        rng["torch"] = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")
    return rng


def seed_rng(seed: int) -> None:
    """Seed every global generator :func:`capture_rng` records. ``keras.utils.set_random_seed``
    seeds Python, NumPy, TensorFlow's op seed and Keras's; TensorFlow's global
    ``tf.random.Generator`` ignores ``tf.random.set_seed``, so it is reseeded here: else two runs
    with one seed draw differently from ``tf.random.get_global_generator()``."""
    import tensorflow as tf

    from ckptstore.keras_io.backend import keras

    keras.utils.set_random_seed(seed)
    tf.random.set_global_generator(tf.random.Generator.from_seed(seed))


def restore_rng(rng: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` recorded (unknown keys are ignored)."""
    if "python" in rng:
        version, internal, gauss = rng["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "tensorflow" in rng and "tensorflow" in sys.modules:
        import tensorflow as tf

        gen = tf.random.get_global_generator()
        gen.reset(np.asarray(rng["tensorflow"]["state"], dtype=np.int64))
    if "torch" in rng and "torch" in sys.modules:
        import torch

        state = np.frombuffer(base64.b64decode(rng["torch"]), dtype=np.uint8).copy()
        torch.set_rng_state(torch.from_numpy(state))
    if "keras_global_seed" in rng:
        from keras.src.random.seed_generator import global_seed_generator

        gen = global_seed_generator()
        gen.state.assign(np.asarray(rng["keras_global_seed"], dtype=gen.state.dtype))


def get_rng_state() -> dict[str, Any]:
    """Determined's ``det.keras.get_rng_state()``: the Python, NumPy, TensorFlow, Keras (and
    PyTorch's, where it is imported) RNG states as a JSON-able dict (see :func:`capture_rng`)."""
    return capture_rng()


def set_rng_state(rng_state: dict[str, Any]) -> None:
    """Determined's ``det.keras.set_rng_state()``: restore what :func:`get_rng_state` returned."""
    restore_rng(rng_state)


def _keras_global_seed_generator() -> Any:
    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state

        return global_state.get_global_attribute("global_seed_generator")
    except Exception:  # noqa: BLE001
        return None


# ---- variables the .keras format leaves out --------------------------------------------------
def capture_extra_variables(model: KerasModel, saved_ids: set[int]) -> dict[str, Any]:
    """``{path: value}`` of the model's variables that are not in ``saved_ids`` and are not
    metric accumulators (metrics reset every epoch): mainly ``SeedGenerator`` states."""
    metric_ids = {id(v) for v in getattr(model, "metrics_variables", [])}
    out: dict[str, Any] = {}
    for variable in model.variables:
        if id(variable) in saved_ids or id(variable) in metric_ids:
            continue
        out[_variable_path(variable)] = {
            "dtype": str(variable.dtype),
            "value": np.asarray(variable.numpy()).tolist(),
        }
    return out


def restore_extra_variables(model: KerasModel, extra: dict[str, Any]) -> None:
    """Assign values recorded by :func:`capture_extra_variables` back by variable path."""
    if not extra:
        return
    by_path = {_variable_path(v): v for v in model.variables}
    for path, item in extra.items():
        variable = by_path.get(path)
        if variable is None:
            logger.warning(
                "Checkpoint holds state for variable %r which this model does not have; ignored.",
                path,
            )
            continue
        variable.assign(np.asarray(item["value"], dtype=item["dtype"]))


def _variable_path(variable: Any) -> str:
    # Keras 3 variables have a ``path``; Keras 2 (tf.Variable) ones only a ``name``.
    return getattr(variable, "path", None) or variable.name


# ---- callbacks -------------------------------------------------------------------------------
def stateful_callbacks(callbacks: list[Any]) -> dict[str, Any]:
    """``{key: callback}`` for every callback with ``get_state`` and ``load_state``, and for
    Keras's ``History``, ``EarlyStopping``, ``ReduceLROnPlateau`` and ``ModelCheckpoint``
    (through an adapter from :mod:`ckptstore.keras_io.fit._keras_callback_state`).

    Keys are the class name, suffixed ``_1``, ``_2``... for repeats, in list order, so the same
    ``fit()`` call maps states back to the same callbacks.
    """
    from ckptstore.keras_io.fit._keras_callback_state import with_state

    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for original in callbacks:
        cb = with_state(original)  # Keras's History, EarlyStopping, ... get an adapter
        if cb is None:
            continue
        name = type(original).__name__
        n = counts.get(name, 0)
        counts[name] = n + 1
        out[name if n == 0 else f"{name}_{n}"] = cb
    return out
