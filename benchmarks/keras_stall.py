"""How long does checkpointing hold up ``model.fit()``? DeterminedCallback vs Keras's own savers.

For one or more model sizes (weights + Adam state) this prints, in one run:

- yardsticks on the training thread: ``model.save`` to local disk, ``model.export`` (the
  SavedModel), and the synchronous peer ``model.save`` + upload to the S3 emulator;
- for every configuration, per checkpoint: the time ``fit()`` is blocked at a checkpoint
  (inside the callback between epochs) and at the **final** checkpoint (the last epoch's save
  through ``on_train_end``), and the whole cost (below). Configurations, defaults first:
  ``DeterminedCallback`` with its defaults (``export_saved_model="final"``) on local disk and
  on S3, then ``export_saved_model="every"``, ``"best"``, ``"never"``; Keras's own
  ``BackupAndRestore`` and ``ModelCheckpoint`` (and ``OrbaxCheckpoint`` when installed); and a
  callback doing ``model.save`` + ``model.export`` on the training thread at every epoch end
  (what DeterminedCallback's SavedModel costs when done in ``fit()``);
- whole cost: ``fit()`` with a checkpoint every epoch, plus waiting until the last checkpoint
  is committed (DeterminedCallback commits exports after ``fit()`` returns), minus the same
  ``fit()`` without checkpoints run just before it, per checkpoint, on local disk (background
  work slows the training steps too). Also in CPU seconds: this process (all threads) plus the
  export worker process (reaped children).

- the extra cost of exact mid-epoch resume per checkpoint (issue 16): the snapshot of the input
  position (a tf.data iterator through ``tf.train.Checkpoint``, or the array order's seed and
  batch index), the RNG states and the epoch's metric accumulators, as DeterminedCallback takes
  it, for shuffled arrays and for a ``tf.data.Dataset`` with a shuffle buffer of the whole data.

``--keras 2`` runs the same on Keras 2 (``TF_USE_LEGACY_KERAS=1``, tf_keras): the yardstick
"model.save" is then Keras 2's ``model.save_weights`` in TensorFlow's checkpoint format (weights
+ optimizer, what DeterminedCallback writes for Keras 2 and what Determined wrote synchronously),
"model.export" is ``model.save(save_format="tf")``, and the peers are Keras 2's own
``BackupAndRestore`` and ``ModelCheckpoint`` (a whole ``.h5`` model with its optimizer).

Everything is measured ``--rounds`` times in one process; the table shows medians and every
round's value; ratios are medians of the per-round ratios.

Target (issue 20): the final checkpoint with a SavedModel (the default) blocks fit()
<= 0.05x ``model.save``, like every other checkpoint.

    .venv/bin/python benchmarks/keras_stall.py --sizes-mb 25 --rounds 3
    .venv/bin/python benchmarks/keras_stall.py --keras 2 --sizes-mb 25 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

WIDTH = 2048


def _keras():
    """The Keras under test: ``tf.keras``'s (Keras 2 with ``--keras 2``), as ckptstore picks it."""
    from ckptstore.keras_io.backend import keras

    return keras


def _keras2() -> bool:
    from ckptstore.keras_io.backend import IS_KERAS2

    return IS_KERAS2


def keras_save(model, path: str) -> None:
    """The yardstick: Keras's own full save (Keras 2: TF-format weights + optimizer)."""
    if _keras2():
        model.save_weights(path)
    else:
        model.save(path + ".keras")


def keras_export(model, path: str) -> None:
    """The inference SavedModel the way each Keras writes it."""
    if _keras2():
        from ckptstore.keras_io.saving import _keras2_format as keras2_format

        keras2_format.export_saved_model(model, path)
    else:
        model.export(path, verbose=False)


def build_model(size_mb: float):
    """Dense stack whose weights + Adam slots (3 x float32 per parameter) total ~size_mb."""
    keras = _keras()

    params_per_layer = WIDTH * WIDTH + WIDTH
    layers = max(1, round(size_mb * 2**20 / 12 / params_per_layer))
    model = keras.Sequential(
        [keras.Input((WIDTH,))] + [keras.layers.Dense(WIDTH) for _ in range(layers)]
    )
    model.compile(keras.optimizers.Adam(1e-4), loss="mse")
    return model


def state_mb(model) -> float:
    optimizer_variables = model.optimizer.variables
    if callable(optimizer_variables):  # a method on Keras 2
        optimizer_variables = optimizer_variables()
    variables = list(model.variables) + list(optimizer_variables)
    return (
        sum(
            int(np.prod(v.shape)) * np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).itemsize
            for v in variables
        )
        / 2**20
    )


def timed_callback(callback, sink: list[float], final: list[float]) -> None:
    """Record how long ``callback`` holds fit() up at each checkpoint: its ``on_epoch_end``
    plus the following ``on_epoch_begin`` (DeterminedCallback saves there, after the other
    callbacks' ``on_epoch_end``), summed per epoch into ``sink``; the last epoch's
    ``on_epoch_end`` plus ``on_train_end`` (where the final checkpoint is saved) into ``final``."""
    end, begin, train_end = callback.on_epoch_end, callback.on_epoch_begin, callback.on_train_end
    pending: list[float] = []

    def on_epoch_end(epoch, logs=None):
        started = time.perf_counter()
        end(epoch, logs)
        pending.append(time.perf_counter() - started)

    def on_epoch_begin(epoch, logs=None):
        started = time.perf_counter()
        begin(epoch, logs)
        if pending:
            sink.append(pending.pop() + time.perf_counter() - started)

    def on_train_end(logs=None):
        started = time.perf_counter()
        train_end(logs)
        final.append((pending.pop() if pending else 0.0) + time.perf_counter() - started)

    callback.on_epoch_end = on_epoch_end
    callback.on_epoch_begin = on_epoch_begin
    callback.on_train_end = on_train_end


class SaveAndExport:
    """Keras callback: ``model.save`` + ``model.export`` at every epoch end, on the training
    thread (the peer for an export done inside fit())."""

    def __new__(cls, folder: str):
        keras = _keras()

        class _SaveAndExport(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                keras_save(self.model, os.path.join(folder, f"e{epoch}"))
                keras_export(self.model, os.path.join(folder, f"e{epoch}-saved_model"))

        return _SaveAndExport()


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its reaped children (the export worker),
    user + system."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_fit(model, data, epochs: int, callbacks: list) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of this process)`` of one ``fit()``."""
    x, y = data
    started, cpu = time.perf_counter(), cpu_seconds()
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return time.perf_counter() - started, cpu_seconds() - cpu


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_round(model, data, args, s3_url: str, work: str) -> dict[str, float]:
    """One measurement of every configuration; seconds per checkpoint."""
    keras = _keras()

    import ckptstore as det
    from ckptstore.checkpointing import CheckpointContext, scan

    out: dict[str, float] = {}

    # yardstick: keras model.save to local disk
    saves = []
    for i in range(args.repeats):
        path = os.path.join(work, f"save{i}")
        t0 = time.perf_counter()
        keras_save(model, path)
        saves.append(time.perf_counter() - t0)
        for name in os.listdir(work):
            if name.startswith(f"save{i}") or name == "checkpoint":
                os.remove(os.path.join(work, name))
    out["model.save"] = median(saves)

    # synchronous peer: save locally, then upload to S3, all while fit() waits
    sync = []
    with CheckpointContext(s3_url) as ckpt:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            d = tempfile.mkdtemp(dir=work)
            keras_save(model, os.path.join(d, "model"))
            uuid = ckpt.upload(d, {"steps_completed": 0})
            shutil.rmtree(d)
            sync.append(time.perf_counter() - t0)
            ckpt.delete(uuid)  # keep the emulator's memory flat
    out["save+upload (sync)"] = median(sync)

    exports = []
    for i in range(args.repeats):
        path = os.path.join(work, f"export{i}")
        t0 = time.perf_counter()
        keras_export(model, path)
        exports.append(time.perf_counter() - t0)
        shutil.rmtree(path)
    out["model.export"] = median(exports)
    out["model.save + model.export"] = out["model.save"] + out["model.export"]

    def det_callback(storage: str, tag: str, export: str | None = None):
        def make(stack: contextlib.ExitStack):
            reg = f"sqlite:///{work}/reg-{tag}.db"
            ctx = stack.enter_context(
                det.core.init(storage=storage, registry=reg, trial_id=1, preempt_signals=False)
            )
            store = ctx.checkpoint.storage
            stack.callback(  # runs before the context closes: keep the emulator's memory flat
                lambda: [ctx.checkpoint.delete(u) for u in scan.list_committed(store)]
            )
            kwargs = {} if export is None else {"export_saved_model": export}
            return det.keras.DeterminedCallback(ctx, None, 1, **kwargs)

        return make

    local_dir = os.path.join(work, "local-ckpts")
    configs = {
        "Det default (export final), local": det_callback(local_dir, "local"),
        "Det default (export final), S3": det_callback(s3_url, "s3"),
        "Det export every, local": det_callback(local_dir, "every", "every"),
        "Det export best, local": det_callback(local_dir, "best", "best"),
        "Det export never, local": det_callback(local_dir, "never", "never"),
        "BackupAndRestore": lambda stack: keras.callbacks.BackupAndRestore(
            os.path.join(work, "bar"), delete_checkpoint=True
        ),
        "ModelCheckpoint": lambda stack: keras.callbacks.ModelCheckpoint(
            os.path.join(work, "mc-{epoch}.h5" if _keras2() else "mc-{epoch}.keras")
        ),
        "save+export on the training thread": lambda stack: SaveAndExport(os.path.join(work, "sx")),
    }
    if hasattr(keras.callbacks, "OrbaxCheckpoint"):
        try:
            import orbax.checkpoint  # noqa: F401

            configs["OrbaxCheckpoint"] = lambda stack: keras.callbacks.OrbaxCheckpoint(
                os.path.join(work, "orbax")
            )
        except ImportError:
            logging.info("orbax-checkpoint not installed: OrbaxCheckpoint peer skipped")
    for name, make in configs.items():
        # The whole cost is paired with a fit() without checkpoints run just before it, so
        # drifting load from other processes cancels out as far as possible.
        wall_none, cpu_none = run_fit(model, data, args.epochs, [])
        blocked: list[float] = []
        final: list[float] = []
        os.makedirs(os.path.join(work, "sx"), exist_ok=True)
        with contextlib.ExitStack() as stack:
            cb = make(stack)
            timed_callback(cb, blocked, final)
            started, cpu = time.perf_counter(), cpu_seconds()
            run_fit(model, data, args.epochs, [cb])
            if hasattr(cb, "wait"):
                cb.wait()  # until the last checkpoint (and its export) is committed
            wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        out[f"{name} blocked"] = median(blocked)
        out[f"{name} final blocked"] = median(final)
        if "S3" not in name:  # the whole cost is measured on local disk
            out[f"{name} whole cost"] = (wall - wall_none) / args.epochs
            out[f"{name} whole cost (CPU s)"] = (cpu - cpu_none) / args.epochs
        if not hasattr(model, "_training_state") and _keras2():
            model._training_state = None  # Keras 2's BackupAndRestore deletes it at train end
        for leftover in ("bar", "orbax", "local-ckpts", "sx"):
            shutil.rmtree(os.path.join(work, leftover), ignore_errors=True)
        for f in os.listdir(work):
            if f.startswith("mc-"):
                os.remove(os.path.join(work, f))
    return out


class _MeasureExactState:
    """Times, in the middle of every epoch, what DeterminedCallback adds to a checkpoint for an
    exact mid-epoch resume: input position, RNG states, metric accumulators."""

    def __new__(cls, det_cb, times: list[float], work: str):
        keras = _keras()

        from ckptstore.keras_io.data import _resumable as resumable_data
        from ckptstore.keras_io.fit import _callback_state as callback_state

        class Measure(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch != 1:
                    return
                folder = tempfile.mkdtemp(dir=work)
                t0 = time.perf_counter()
                det_cb._data.snapshot(0, batch + 1, folder)
                callback_state.capture_rng()
                resumable_data.capture_metrics(self.model)
                times.append(time.perf_counter() - t0)
                shutil.rmtree(folder)

        return Measure()


def exact_resume_cost(model, data, args, work: str) -> dict[str, float]:
    """Seconds per checkpoint of the state only exact mid-epoch resume needs (issue 16)."""
    import tensorflow as tf

    import ckptstore as det

    out: dict[str, float] = {}
    x, y = data
    inputs = {
        "arrays": ((x, y), {"batch_size": 16, "shuffle": True}),
        "tf.data": (
            (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(16),),
            {"shuffle": False},  # the dataset shuffles itself
        ),
    }
    for name, (fit_args, fit_kwargs) in inputs.items():
        times: list[float] = []
        reg = f"sqlite:///{tempfile.mkdtemp(dir=work)}/reg.db"  # a fresh index per run
        with det.core.init(
            storage=os.path.join(work, "exact"), registry=reg, trial_id=1, preempt_signals=False
        ) as ctx:
            det_cb = det.keras.DeterminedCallback(
                ctx, None, 1, checkpoint_epochs=0, export_saved_model="never"
            )
            model.fit(
                *fit_args,
                epochs=args.epochs,
                verbose=0,
                callbacks=[det_cb, _MeasureExactState(det_cb, times, work)],
                **fit_kwargs,
            )
        shutil.rmtree(os.path.join(work, "exact"), ignore_errors=True)
        out[f"exact-resume state, {name}"] = median(times)
    return out


def bench_size(size_mb: float, args, s3_url: str, work: str) -> tuple[float, list[dict]]:
    model = build_model(size_mb)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16 * args.steps, WIDTH), dtype=np.float32)
    data = (x, x)
    run_fit(model, data, 1, [])  # build + warm up
    rounds = []
    for i in range(args.rounds):
        rounds.append(bench_round(model, data, args, f"{s3_url}/round{i}", work))
        if not _keras2():  # mid-epoch resume state is a Keras 3 feature (issue 16)
            rounds[-1].update(exact_resume_cost(model, data, args, work))
        logging.info("round %d: %s", i, rounds[-1])
    return state_mb(model), rounds


def report(mb: float, rounds: list[dict], args) -> None:
    """Print medians over the rounds; ratios are medians of the per-round ratios."""
    keys = list(rounds[0])
    med = {k: median([r[k] for r in rounds]) for k in keys}

    def ratio(a: str, b: str) -> float:
        return median([r[a] / r[b] for r in rounds])

    from ckptstore.keras_io.backend import FRAMEWORK

    print(
        f"\n=== {FRAMEWORK}: model state {mb:.0f} MB (weights + Adam), {args.epochs} epochs x {args.steps} "
        f"steps, median of {len(rounds)} rounds, load average {os.getloadavg()[0]:.1f} ==="
    )
    print(
        f"{'measure (seconds per checkpoint)':52s} {'median s':>9s} {'x model.save':>13s}  rounds"
    )
    for key in keys:
        values = " ".join(f"{r[key]:.3f}" for r in rounds)
        print(f"{key:52s} {med[key]:9.3f} {ratio(key, 'model.save'):13.2f}  [{values}]")
    default = "Det default (export final), local"
    print(
        f"target: final checkpoint with SavedModel (default) blocks fit() "
        f"{ratio(default + ' final blocked', 'model.save'):.3f}x model.save (<= 0.05x); other "
        f"checkpoints {ratio(default + ' blocked', 'model.save'):.3f}x; on S3 final "
        f"{ratio('Det default (export final), S3 final blocked', 'model.save'):.3f}x; "
        f"sync save+upload / blocked (S3) "
        f"{median([r['save+upload (sync)'] / r['Det default (export final), S3 blocked'] for r in rounds]):.0f}x"
    )
    print(
        f"default whole cost {ratio(default + ' whole cost', 'model.save'):.2f}x model.save "
        f"(CPU incl. export worker {ratio(default + ' whole cost (CPU s)', 'model.save'):.2f}x); "
        f"save+export on the training thread: final blocked "
        f"{ratio('save+export on the training thread final blocked', 'model.save'):.2f}x, "
        f"whole cost {ratio('save+export on the training thread whole cost', 'model.save'):.2f}x"
    )
    for name in ("arrays", "tf.data"):
        key = f"exact-resume state, {name}"
        if key not in med:
            continue
        print(
            f"exact mid-epoch resume, {name}: +{med[key] * 1000:.1f} ms per checkpoint = "
            f"{ratio(key, 'model.save'):.4f}x model.save, "
            f"{ratio(key, default + ' blocked'):.2f}x the default checkpoint's blocked time"
        )
    for peer in ("BackupAndRestore", "ModelCheckpoint", "OrbaxCheckpoint"):
        if f"{peer} blocked" in med:
            print(
                f"default vs {peer}: blocked {ratio(default + ' blocked', peer + ' blocked'):.2f}x,"
                f" whole cost {med[default + ' whole cost'] / med[peer + ' whole cost']:.2f}x"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="25", help="comma-separated state sizes")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="training steps per epoch")
    parser.add_argument("--repeats", type=int, default=3, help="model.save timings per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (medians)")
    parser.add_argument(
        "--keras",
        choices=("2", "3"),
        default="3",
        help="3: Keras 3; 2: Keras 2 (tf_keras, sets TF_USE_LEGACY_KERAS=1 before TF is imported)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if args.keras == "2" else "0"
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax's per-save notices

    from tests.servers.emulators import create_bucket, start_server

    work = tempfile.mkdtemp(prefix="keras-stall-")
    server = start_server("s3", os.path.join(work, "s3"))
    try:
        os.environ.update(server.env)
        create_bucket(server, "stall")
        for size in [float(s) for s in args.sizes_mb.split(",") if s]:
            size_work = tempfile.mkdtemp(dir=work)
            mb, rounds = bench_size(size, args, f"s3://stall/{int(size)}mb", size_work)
            report(mb, rounds, args)
            sys.stdout.flush()
            shutil.rmtree(size_work, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
