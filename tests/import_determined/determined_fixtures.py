"""Build Determined checkpoint folders with TensorFlow's own checkpoint writer and h5py.

The object names mirror what ``tf.keras`` ``model.save_weights()`` records (``layer-N``,
``layer_with_weights-N``, ``kernel``/``bias``, optimizer ``iter`` and ``m``/``v`` slots), so
the loader sees the same object graph as a real Determined checkpoint. No binaries are shipped.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence

import numpy as np

DENSE_SHAPES = ((3, 4), (4, 2))  # Input(3) -> Dense(4) -> Dense(2)


class CreatesFileWhenUnpickled:
    """A pickle payload with a visible side effect: unpickling creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def make_values(seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Weights (kernel, bias per Dense) and Adam slots m/v for the tiny model, all distinct."""
    rng = np.random.default_rng(seed)
    weights: list[np.ndarray] = []
    for n_in, n_out in DENSE_SHAPES:
        weights.append(rng.normal(size=(n_in, n_out)).astype("float32"))
        weights.append(rng.normal(size=(n_out,)).astype("float32"))
    m = [rng.normal(size=w.shape).astype("float32") for w in weights]
    v = [np.abs(rng.normal(size=w.shape)).astype("float32") for w in weights]
    return {"weights": weights, "m": m, "v": v}


def build_keras_model(optimizer: str | None = "adam"):
    """The Keras 3 model the user's code would build for these checkpoints."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="dense"),
            keras.layers.Dense(2, name="dense_1"),
        ]
    )
    if optimizer:
        model.compile(optimizer=optimizer, loss="mse")
    return model


def _write_tf_weights(
    prefix: str, values: dict, iterations: int | None, with_optimizer: bool
) -> None:
    import tensorflow as tf

    class Layer(tf.Module):
        pass

    class LegacyOptimizer(tf.Module):
        """Tracks ``iter`` and exposes slots the way tf.keras OptimizerV2 does to the saver."""

        def __init__(self, slots: dict) -> None:
            super().__init__()
            self.iter = tf.Variable(np.int64(iterations or 0), name="iter")
            holder = type("Holder", (), {})()
            holder.slots = slots
            self._holder = holder

        def get_slot_names(self) -> list[str]:
            return ["m", "v"]

        def get_slot(self, var, name):
            return self._holder.slots.get(var.ref(), {}).get(name)

        def _create_or_restore_slot_variable(self, *args, **kwargs) -> None:
            pass

    weights = values["weights"]
    layers = []
    variables = []
    for i in range(0, len(weights), 2):
        layer = Layer()
        layer.kernel = tf.Variable(weights[i])
        layer.bias = tf.Variable(weights[i + 1])
        layers.append(layer)
        variables += [layer.kernel, layer.bias]
    children = {}
    # Keras 2 Sequential: layer-0 is the InputLayer (no weights); layer-(i+1) aliases the Dense.
    children["layer-0"] = Layer()
    for i, layer in enumerate(layers):
        children[f"layer-{i + 1}"] = layer
        children[f"layer_with_weights-{i}"] = layer
    if with_optimizer:
        slots = {
            var.ref(): {"m": tf.Variable(values["m"][i]), "v": tf.Variable(values["v"][i])}
            for i, var in enumerate(variables)
        }
        children["optimizer"] = LegacyOptimizer(slots)
    tf.train.Checkpoint(**children).write(prefix)
    folder, name = os.path.split(prefix)
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')


def _h5_optimizer_group(group, values: dict, iterations: int) -> None:
    names = ["Adam/iter:0"]
    data = [np.int64(iterations)]
    var_names = ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
    for slot in ("m", "v"):
        for var_name, value in zip(var_names, values[slot], strict=True):
            names.append(f"Adam/{var_name}/{slot}:0")
            data.append(value)
    group.attrs["weight_names"] = [n.encode("utf8") for n in names]
    for name, value in zip(names, data, strict=True):
        group.create_dataset(name, data=value)


def write_callback_checkpoint(
    folder: str,
    values: dict,
    *,
    steps_completed: int = 40,
    epoch: int = 3,
    continue_id: int = 11,
    iterations: int = 40,
) -> str:
    """A DeterminedCallback checkpoint folder."""
    os.makedirs(folder, exist_ok=True)
    _write_tf_weights(
        os.path.join(folder, "model_checkpoint"), values, iterations, with_optimizer=True
    )
    return write_callback_extras(
        folder, steps_completed=steps_completed, epoch=epoch, continue_id=continue_id
    )


def write_callback_extras(
    folder: str, *, steps_completed: int = 40, epoch: int = 3, continue_id: int = 11
) -> str:
    """DeterminedCallback's files besides the weights: callback_state, metadata.json, code/."""
    os.makedirs(os.path.join(folder, "code"), exist_ok=True)
    with open(os.path.join(folder, "callback_state"), "wb") as f:
        state = {
            "epoch": epoch,
            "steps_completed": steps_completed,
            "continue_id": continue_id,
            "training_length": 10,
            "validation_length": 2,
        }
        pickle.dump(state, f)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"steps_completed": steps_completed}, f)
    with open(os.path.join(folder, "code", "train.py"), "w") as f:
        f.write("print('user code')\n")
    return folder


def write_tfkeras_trial_checkpoint(
    folder: str,
    values: dict,
    *,
    steps_completed: int = 100,
    iterations: int = 100,
    marker: str | None = None,
) -> str:
    """A TFKerasTrial checkpoint folder (TF weights without optimizer, optimizer in .h5).

    ``marker``: rng_state.pkl then holds a payload that creates that file when unpickled.
    """
    import h5py

    os.makedirs(folder, exist_ok=True)
    _write_tf_weights(
        os.path.join(folder, "determined-keras-model-weights"), values, None, with_optimizer=False
    )
    with h5py.File(os.path.join(folder, "determined-keras-optimizer-weights.h5"), "w") as f:
        _h5_optimizer_group(
            f.create_group("optimizer-0").create_group("optimizer_weights"), values, iterations
        )
    return write_tfkeras_trial_extras(folder, steps_completed=steps_completed, marker=marker)


def write_tfkeras_trial_extras(
    folder: str, *, steps_completed: int = 100, marker: str | None = None
) -> str:
    """TFKerasTrial's files besides the weights: pickles, load_data.json, metadata.json, code/."""
    os.makedirs(os.path.join(folder, "code"), exist_ok=True)
    payload = CreatesFileWhenUnpickled(marker) if marker else {"python": 1, "numpy": [1, 2]}
    with open(os.path.join(folder, "rng_state.pkl"), "wb") as f:
        pickle.dump(payload, f)
    with open(os.path.join(folder, "determined-callbacks.v1.pkl"), "wb") as f:
        pickle.dump({}, f)
    with open(os.path.join(folder, "workload_sequencer.pkl"), "wb") as f:
        pickle.dump({"trial_id": 5, "last_ckpt": steps_completed}, f)
    with open(os.path.join(folder, "load_data.json"), "w") as f:
        json.dump(
            {
                "trial_type": "TFKerasTrial",
                "experiment_config": {"name": "mnist", "entrypoint": "model_def:Trial"},
                "hparams": {"lr": 0.01, "units": 4},
                "trial_cls_spec": "model_def:Trial",
                "is_trainable": True,
            },
            f,
        )
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(
            {
                "format": "saved_weights",
                "framework": "tensorflow-2.8.0",
                "steps_completed": steps_completed,
            },
            f,
        )
    return folder


def write_h5_model_checkpoint(folder: str, values: dict, *, iterations: int = 7) -> str:
    """An old (< 0.13.8) TFKerasTrial checkpoint: one Keras 2 HDF5 model file."""
    import h5py

    os.makedirs(folder, exist_ok=True)
    weights = values["weights"]
    with h5py.File(os.path.join(folder, "determined-keras-model.h5"), "w") as f:
        f.attrs["keras_version"] = b"2.3.1"
        f.attrs["backend"] = b"tensorflow"
        model_weights = f.create_group("model_weights")
        layer_names: Sequence[str] = ("input_1", "dense", "dense_1")
        model_weights.attrs["layer_names"] = [n.encode() for n in layer_names]
        model_weights.create_group("input_1").attrs["weight_names"] = []
        for index, layer in enumerate(("dense", "dense_1")):
            group = model_weights.create_group(layer)
            names = [f"{layer}/kernel:0", f"{layer}/bias:0"]
            group.attrs["weight_names"] = [n.encode() for n in names]
            group.create_dataset(names[0], data=weights[2 * index])
            group.create_dataset(names[1], data=weights[2 * index + 1])
        _h5_optimizer_group(f.create_group("optimizer_weights"), values, iterations)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"format": "h5", "framework": "tensorflow-1.15", "steps_completed": 20}, f)
    return folder
