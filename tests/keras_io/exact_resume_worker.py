"""Training script the exact-resume tests run in fresh processes (no tests in here).

    python -m tests.keras_io.exact_resume_worker --dir D --kind arrays --epochs 3 \
        [--sigterm-at-step 7] [--tag first] [--preempt-check-period 3]
    python -m tests.keras_io.exact_resume_worker --straight arrays,tfdata --dir D --epochs 3

Runs on the Keras ``tf.keras`` is (Keras 2 with ``TF_USE_LEGACY_KERAS=1``; the trial kinds
need Keras 3). One tiny model (Dense + Dropout, Adam) trained on 40 samples in batches of 8 (5 steps per
epoch) from the input ``--kind`` names, with DeterminedCallback, ckptstore's EarlyStopping
(``restore_best_weights``), Keras's ReduceLROnPlateau and ModelCheckpoint, and a batch-counting
stateful callback. ``--sigterm-at-step N`` sends this process a real SIGTERM right after
optimizer step N. Writes ``<dir>/<tag>.npz`` (model and optimizer variables, EarlyStopping's best
weights) and ``<dir>/<tag>.json`` (history, callbacks' state, iterations, ...).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ckptstore as det  # noqa: E402
from tests.keras_io.keras_under_test import (  # noqa: E402
    KERAS_MAJOR,
    keras,
    optimizer_variables,
    variable_path,
)

BATCH = 8
SAMPLES = 40  # 5 batches per epoch
KINDS = (
    "arrays",
    "arrays_shuffle",
    "pydataset",
    "tfdata",
    "tfdata_spe2",
    "wrap_data",
    "generator",
    "inmemory_dict",
    "torch_loader",
    "pydataset_threads",
    "pydataset_processes",
)
#: compile(steps_per_execution=k) of the kinds that set it (5 batches an epoch: executions of
#: 2, 2 and 1).
STEPS_PER_EXECUTION = {"tfdata_spe2": 2}
#: TFKerasTrial data types (tests/keras_io/trial/tiny_trial.py) run by the trial controller.
TRIAL_KINDS = ("trial_in_memory", "trial_adapter_threads", "trial_dataset")
TRIAL_BATCHES = 12  # 64 records / 16 = 4 batches per pass, 3 passes


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(SAMPLES, 4).astype("float32")
    y = (x.sum(axis=1) * 1.7).astype("int64") % 3
    return x, y


class Batches(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
    """A PyDataset (Keras 2: a Sequence) of fixed batches (Keras reorders it with
    fit(shuffle=True))."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__()
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int):
        return self.x[i * BATCH : (i + 1) * BATCH], self.y[i * BATCH : (i + 1) * BATCH]


class ReorderingBatches(Batches):
    """A PyDataset read by ``workers`` (threads or processes) that reorders its batches in ``on_epoch_end``
    (its order saved with ``get_state()``): a batch read ahead for one epoch and served in
    another is seen."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs) -> None:
        super().__init__(x, y)
        keras.utils.PyDataset.__init__(self, **kwargs)
        self.epochs_ended = 0
        self.order = np.arange(len(self))

    def __getitem__(self, i: int):
        return super().__getitem__(int(self.order[i]))

    def on_epoch_end(self):
        self.epochs_ended += 1
        self.order = np.random.default_rng([7, self.epochs_ended]).permutation(len(self))

    def get_state(self):
        return {"epochs_ended": self.epochs_ended}

    def load_state(self, state):
        self.epochs_ended = state["epochs_ended"] - 1
        self.on_epoch_end()


def two_outputs(y: np.ndarray) -> dict[str, np.ndarray]:
    """The labels of :func:`build_two_output_model` (outputs ``a`` and ``b``)."""
    return {"a": y, "b": y % 2}


def build_two_output_model() -> keras.Model:
    """A functional model with outputs ``a`` (3 classes) and ``b`` (2), fed dict labels."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dropout(0.25)(keras.layers.Dense(8, activation="relu")(inputs))
    outputs = {
        "a": keras.layers.Dense(3, name="a")(hidden),
        "b": keras.layers.Dense(2, name="b")(hidden),
    }
    model = keras.Model(inputs, outputs)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(
        keras.optimizers.Adam(0.02),
        loss={"a": loss, "b": loss},
        metrics={"a": ["accuracy"], "b": ["accuracy"]},
    )
    return model


def build_model(steps_per_execution: int = 1) -> keras.Model:
    if KERAS_MAJOR == 2:  # Dropout's RNG state in the checkpoints (see keras2_format)
        keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.25),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **({"steps_per_execution": steps_per_execution} if steps_per_execution > 1 else {}),
    )
    return model


class BatchCounter(det.keras.Callback):
    """Stateful at batch level: the exact batch count must survive a mid-epoch preemption."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.loss_sum = 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        self.loss_sum += float(logs["loss"])

    def get_state(self):
        return {"batches": self.batches, "loss_sum": self.loss_sum}

    def load_state(self, state):
        self.batches, self.loss_sum = state["batches"], state["loss_sum"]


class Sigterm(keras.callbacks.Callback):
    """Sends this process SIGTERM right after optimizer step ``step`` (before the other
    callbacks see that batch end: it is first in the list)."""

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.step = step
        self.steps_here = 0
        self._before: int | None = None

    def on_train_batch_begin(self, batch, logs=None):
        self._before = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        # the optimizer steps of this call: compile(steps_per_execution=k) trains up to k
        # batches a call, fewer in an epoch's last one (the trial controller calls no
        # on_train_batch_begin: one batch a call)
        now = int(self.model.optimizer.iterations.numpy())
        self.steps_here += 1 if self._before is None else now - self._before
        if self.step is not None and int(self.model.optimizer.iterations.numpy()) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def fit_input(kind: str, x: np.ndarray, y: np.ndarray) -> tuple[tuple, dict]:
    if kind == "arrays":
        return (x, y), {"batch_size": BATCH, "shuffle": False}
    if kind == "arrays_shuffle":
        return (x, y), {"batch_size": BATCH, "shuffle": True}
    if kind == "pydataset":
        return (Batches(x, y),), {"shuffle": True}
    if kind in ("tfdata", "tfdata_spe2"):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=3).batch(BATCH)
        return (ds,), {}
    if kind == "generator":

        def gen():
            while True:
                for i in range(0, SAMPLES, BATCH):
                    yield x[i : i + BATCH], y[i : i + BATCH]

        return (gen(),), {"steps_per_epoch": SAMPLES // BATCH}
    if kind in ("pydataset_threads", "pydataset_processes"):
        processes = kind == "pydataset_processes"
        batches = ReorderingBatches(x, y, workers=2, use_multiprocessing=processes)
        return (batches,), {"shuffle": False}
    if kind == "torch_loader":  # any backend: the epoch's order drawn when it begins
        import torch

        torch.manual_seed(4)  # on TensorFlow and JAX keras.utils.set_random_seed leaves it
        pairs = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        return (torch.utils.data.DataLoader(pairs, batch_size=BATCH, shuffle=True),), {}
    if kind == "inmemory_dict":  # Determined's InMemorySequence with a dict of labels
        return (det.keras.InMemorySequence(x, two_outputs(y), BATCH),), {"shuffle": True}
    raise ValueError(kind)


def run_trial(args) -> int:
    """A TFKerasTrial through the trial controller; SIGTERM after batch ``--sigterm-at-step``."""
    from ckptstore.keras_io.trial.controller import TrialController
    from ckptstore.registry import Registry
    from tests.keras_io.trial.tiny_trial import TinyTrial, make_data

    data_type = args.kind.removeprefix("trial_")

    class ResumeTrial(TinyTrial):
        def _data(self, seed):
            if data_type != "dataset" or seed != 0:  # shuffled training data only
                return super()._data(seed)
            x, y = make_data(seed=seed)
            bs = self.context.get_per_slot_batch_size()
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=5).batch(bs)
            return self.context.wrap_dataset(ds)

        def keras_callbacks(self):
            return [*super().keras_callbacks(), sigterm]

    sigterm = Sigterm(args.sigterm_at_step)
    cfg = {
        "hyperparameters": {"global_batch_size": 16, "data_type": data_type},
        "searcher": {
            "name": "single",
            "metric": "val_accuracy",
            "smaller_is_better": False,
            "max_length": {"batches": TRIAL_BATCHES},
        },
        "min_validation_period": {"batches": 4},
        "scheduling_unit": 3,
        "entrypoint": "x:ResumeTrial",
    }
    tf.config.experimental.enable_op_determinism()
    registry = Registry(f"sqlite:///{os.path.join(args.dir, 'registry.db')}")
    hparams = {"global_batch_size": 16, "data_type": data_type}
    with det.core.init(
        storage=os.path.join(args.dir, "ckpts"), registry=registry, trial_id=1, hparams=hparams
    ) as core:
        controller = TrialController(ResumeTrial, core, cfg, trial_seed=3)
        result = controller.run()
    model = controller.model
    arrays = {f"model/{v.path}": v.numpy() for v in model.variables}
    arrays.update({f"optimizer/{v.path}": v.numpy() for v in model.optimizer.variables})
    np.savez(os.path.join(args.dir, f"{args.tag}.npz"), **arrays)
    validation = [(m.steps_completed, m.metrics) for m in registry.get_metrics(1, "validation")]
    summary = {
        "status": result.status,
        "preempted": result.status == "preempted",
        "steps_here": sigterm.steps_here,
        "iterations": int(model.optimizer.iterations.numpy()),
        "batches_trained": result.batches_trained,
        "counter": TinyTrial.last_counter.get_state(),
        "validation": validation,
        "resumed": sigterm.steps_here < result.batches_trained,
    }
    registry.close()
    with open(os.path.join(args.dir, f"{args.tag}.json"), "w") as f:
        json.dump(summary, f, default=float)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--kind", choices=KINDS + TRIAL_KINDS, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sigterm-at-step", type=int, default=None)
    p.add_argument("--tag", default="result")
    p.add_argument("--preempt-check-period", type=int, default=None)
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.kind in TRIAL_KINDS:
        return run_trial(args)
    tf.config.experimental.enable_op_determinism()
    storage = os.path.join(args.dir, "ckpts")
    registry = f"sqlite:///{os.path.join(args.dir, 'registry.db')}"
    x, y = data()
    if args.kind == "inmemory_dict":
        model, validation = build_two_output_model(), (x, two_outputs(y))
    else:
        model, validation = build_model(STEPS_PER_EXECUTION.get(args.kind, 1)), (x, y)
    stop = det.keras.EarlyStopping(
        monitor="val_loss", patience=50, min_delta=1e-9, restore_best_weights=True
    )
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, factor=0.7)
    best = keras.callbacks.ModelCheckpoint(
        os.path.join(args.dir, f"{args.tag}-best.weights.h5"),
        monitor="val_loss",
        save_best_only=True,
        save_weights_only=True,
    )
    counter = BatchCounter()
    sigterm = Sigterm(args.sigterm_at_step)
    callbacks = [sigterm, stop, plateau, best, counter]

    if args.kind == "wrap_data":
        # ctx.fit() makes its own DeterminedCallback; remember it to read its counters
        from ckptstore.keras_io.fit import _callback as determined_callback

        made: list = []

        class Recorded(determined_callback.DeterminedCallback):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                made.append(self)

        determined_callback.DeterminedCallback = Recorded
        with det.keras.init(storage=storage, registry=registry, trial_id=1) as ctx:
            xs, ys = ctx.wrap_data(x, y)
            history = ctx.fit(
                model,
                xs,
                ys,
                validation_data=validation,
                epochs=args.epochs,
                batch_size=BATCH,
                shuffle=True,
                verbose=0,
                callbacks=callbacks,
            )
            det_cb = made[0]
            preempted = ctx.core.preempt.acknowledged
    else:
        with det.core.init(storage=storage, registry=registry, trial_id=1) as core:
            period = {}
            if args.preempt_check_period is not None:
                period["preempt_check_period"] = args.preempt_check_period
            det_cb = det.keras.DeterminedCallback(
                core,
                checkpoint=core.info.latest_checkpoint,
                continue_id=core.info.trial.trial_id,
                export_saved_model="never",
                **period,
            )
            inputs, kwargs = fit_input(args.kind, x, y)
            history = model.fit(
                *inputs,
                epochs=args.epochs,
                validation_data=validation,
                verbose=0,
                callbacks=[sigterm, det_cb, *callbacks[1:]],
                **kwargs,
            )
            preempted = core.preempt.acknowledged
    det_cb.wait()

    arrays = {f"model/{variable_path(v)}": v.numpy() for v in model.variables}
    arrays.update({f"optimizer/{variable_path(v)}": v.numpy() for v in optimizer_variables(model)})
    for i, w in enumerate(stop.best_weights or []):
        arrays[f"best_weights/{i}"] = np.asarray(w)
    np.savez(os.path.join(args.dir, f"{args.tag}.npz"), **arrays)
    summary = {
        "history": history.history,
        "history_epochs": history.epoch,
        "steps_here": sigterm.steps_here,
        "steps_completed": det_cb.steps_completed,
        "resumed": det_cb.resumed,
        "last_checkpoint": det_cb.last_checkpoint,
        "iterations": int(model.optimizer.iterations.numpy()),
        "learning_rate": float(model.optimizer.learning_rate.numpy()),
        "early_stopping": {k: v for k, v in stop.get_state().items() if k != "best_weights"},
        "plateau": {
            "wait": plateau.wait,
            "cooldown": plateau.cooldown_counter,
            "best": plateau.best,
        },
        "model_checkpoint_best": float(best.best),
        "counter": counter.get_state(),
        "preempted": bool(preempted),
    }
    with open(os.path.join(args.dir, f"{args.tag}.json"), "w") as f:
        json.dump(summary, f, default=float)
    return 0


def straight_runs(argv: list[str]) -> int:
    """``--straight KIND,KIND --dir D --epochs N``: the uninterrupted run of each kind, one after
    another in this process (``D/KIND/straight.*``): one TensorFlow start instead of one each."""
    p = argparse.ArgumentParser()
    p.add_argument("--straight", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--epochs", default="3")
    args = p.parse_args(argv)
    from ckptstore.keras_io.fit import _callback as determined_callback

    made = determined_callback.DeterminedCallback  # wrap_data's run replaces it
    for kind in args.straight.split(","):
        keras.backend.clear_session()  # the same layer and variable names as a fresh process
        folder = os.path.join(args.dir, kind)
        os.makedirs(folder, exist_ok=True)
        try:
            main(["--dir", folder, "--kind", kind, "--epochs", args.epochs, "--tag", "straight"])
        finally:
            determined_callback.DeterminedCallback = made
    return 0


if __name__ == "__main__":
    sys.exit(straight_runs(sys.argv[1:]) if "--straight" in sys.argv else main())
