"""How long does checkpointing hold up ``model.fit()``? DeterminedCallback vs Keras's own savers.

For each model size (weights + Adam state, e.g. ~100 MB and ~400 MB) this prints, in one run:

- ``model.save`` to local disk (the yardstick);
- the synchronous peer: ``model.save`` to a local folder, then upload it to the S3 emulator;
- time ``fit()`` is blocked per checkpoint (time spent inside the callback's ``on_epoch_end``)
  for DeterminedCallback to the S3 emulator and to local disk, Keras's ``BackupAndRestore`` and
  ``ModelCheckpoint`` (and ``OrbaxCheckpoint`` when ``orbax`` is installed);
- the whole cost: fit() wall time with a checkpoint every epoch minus the same fit() without
  checkpoints (run just before it), per checkpoint, on local disk (background work also slows
  the training steps; fit() includes waiting for the last checkpoint to be committed). On a
  shared machine other processes make wall times noisy, so the same difference is also given
  in CPU seconds of this process (all threads: training, writer, Orbax's, ...).

Everything is measured ``--rounds`` times (default 5) in one process; the table shows medians
and every round's value; ratios are medians of the per-round ratios.

Goals (issue 4): blocked <= 0.25x model.save and >= 5x less than save-then-upload; whole cost
<= 0.5x model.save.

    .venv/bin/python benchmarks/keras_stall.py --sizes-mb 100,400
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


def build_model(size_mb: float):
    """Dense stack whose weights + Adam slots (3 x float32 per parameter) total ~size_mb."""
    import keras

    params_per_layer = WIDTH * WIDTH + WIDTH
    layers = max(1, round(size_mb * 2**20 / 12 / params_per_layer))
    model = keras.Sequential(
        [keras.Input((WIDTH,))] + [keras.layers.Dense(WIDTH) for _ in range(layers)]
    )
    model.compile(keras.optimizers.Adam(1e-4), loss="mse")
    return model


def state_mb(model) -> float:
    variables = list(model.variables) + list(model.optimizer.variables)
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables) / 2**20


def timed_epoch_end(callback, sink: list[float]) -> None:
    """Record how long ``callback`` holds fit() up between epochs: its ``on_epoch_end`` plus the
    following ``on_epoch_begin`` (DeterminedCallback saves there, after the other callbacks'
    ``on_epoch_end``), summed per epoch."""
    end, begin = callback.on_epoch_end, callback.on_epoch_begin
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

    callback.on_epoch_end = on_epoch_end
    callback.on_epoch_begin = on_epoch_begin


def cpu_seconds() -> float:
    """CPU time of this process, all threads (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
    import keras

    import ckptstore as det
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing import format as ckpt_format

    out: dict[str, float] = {}

    # yardstick: keras model.save to local disk
    saves = []
    for i in range(args.repeats):
        path = os.path.join(work, f"save{i}.keras")
        t0 = time.perf_counter()
        model.save(path)
        saves.append(time.perf_counter() - t0)
        os.remove(path)
    out["model.save"] = median(saves)

    # synchronous peer: save locally, then upload to S3, all while fit() waits
    sync = []
    with CheckpointContext(s3_url) as ckpt:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            d = tempfile.mkdtemp(dir=work)
            model.save(os.path.join(d, "model.keras"))
            uuid = ckpt.upload(d, {"steps_completed": 0})
            shutil.rmtree(d)
            sync.append(time.perf_counter() - t0)
            ckpt.delete(uuid)  # keep the emulator's memory flat
    out["save+upload (sync)"] = median(sync)

    def det_callback(storage: str, tag: str):
        def make(stack: contextlib.ExitStack):
            reg = f"sqlite:///{work}/reg-{tag}.db"
            ctx = stack.enter_context(
                det.core.init(storage=storage, registry=reg, trial_id=1, preempt_signals=False)
            )
            store = ctx.checkpoint.storage
            stack.callback(  # runs before the context closes: keep the emulator's memory flat
                lambda: [ctx.checkpoint.delete(u) for u in ckpt_format.list_committed(store)]
            )
            return det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")

        return make

    local_dir = os.path.join(work, "local-ckpts")
    configs = {
        "DeterminedCallback S3": det_callback(s3_url, "s3"),
        "DeterminedCallback local": det_callback(local_dir, "local"),
        "BackupAndRestore": lambda stack: keras.callbacks.BackupAndRestore(
            os.path.join(work, "bar"), delete_checkpoint=True
        ),
        "ModelCheckpoint": lambda stack: keras.callbacks.ModelCheckpoint(
            os.path.join(work, "mc-{epoch}.keras")
        ),
    }
    if hasattr(keras.callbacks, "OrbaxCheckpoint"):
        try:
            import orbax.checkpoint  # noqa: F401

            configs["OrbaxCheckpoint"] = lambda stack: keras.callbacks.OrbaxCheckpoint(
                os.path.join(work, "orbax")
            )
        except ImportError:
            logging.warning("orbax-checkpoint not installed: OrbaxCheckpoint peer skipped")
    for name, make in configs.items():
        # The whole cost is paired with a fit() without checkpoints run just before it, so
        # drifting load from other processes cancels out as far as possible.
        wall_none, cpu_none = run_fit(model, data, args.epochs, [])
        blocked: list[float] = []
        with contextlib.ExitStack() as stack:
            cb = make(stack)
            timed_epoch_end(cb, blocked)
            wall, cpu = run_fit(model, data, args.epochs, [cb])
        out[f"{name} blocked"] = median(blocked)
        if name != "DeterminedCallback S3":  # the whole cost is measured on local disk
            out[f"{name} whole cost"] = (wall - wall_none) / args.epochs
            out[f"{name} whole cost (CPU s)"] = (cpu - cpu_none) / args.epochs
        for leftover in ("bar", "orbax", "local-ckpts"):
            shutil.rmtree(os.path.join(work, leftover), ignore_errors=True)
        for f in os.listdir(work):
            if f.startswith("mc-"):
                os.remove(os.path.join(work, f))
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
        logging.info("round %d: %s", i, rounds[-1])
    return state_mb(model), rounds


def report(mb: float, rounds: list[dict], args) -> None:
    """Print medians over the rounds; ratios are medians of the per-round ratios."""
    keys = list(rounds[0])
    med = {k: median([r[k] for r in rounds]) for k in keys}

    def ratio(a: str, b: str) -> float:
        return median([r[a] / r[b] for r in rounds])

    print(
        f"\n=== model state {mb:.0f} MB (weights + Adam), {args.epochs} epochs x {args.steps} "
        f"steps, median of {len(rounds)} rounds ==="
    )
    print(
        f"{'measure (seconds per checkpoint)':42s} {'median s':>9s} {'x model.save':>13s}  rounds"
    )
    for key in keys:
        values = " ".join(f"{r[key]:.3f}" for r in rounds)
        print(f"{key:42s} {med[key]:9.3f} {ratio(key, 'model.save'):13.2f}  [{values}]")
    det_s3 = "DeterminedCallback S3 blocked"
    det_whole = "DeterminedCallback local whole cost"
    sync_ratio = median([r["save+upload (sync)"] / r[det_s3] for r in rounds])
    print(
        f"goals: blocked (S3) {ratio(det_s3, 'model.save'):.2f}x model.save (<= 0.25x); "
        f"sync save+upload / blocked {sync_ratio:.0f}x (>= 5x); whole cost "
        f"{ratio(det_whole, 'model.save'):.2f}x model.save (<= 0.5x; in CPU seconds "
        f"{ratio(det_whole + ' (CPU s)', 'model.save'):.2f}x)"
    )
    for peer in ("BackupAndRestore", "ModelCheckpoint", "OrbaxCheckpoint"):
        if f"{peer} blocked" in med:
            print(
                f"DeterminedCallback vs {peer}: blocked {ratio(det_s3, peer + ' blocked'):.2f}x, "
                f"whole cost {med[det_whole] / med[peer + ' whole cost']:.2f}x "
                f"(CPU s {med[det_whole + ' (CPU s)'] / med[peer + ' whole cost (CPU s)']:.2f}x)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="100,400", help="comma-separated state sizes")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="training steps per epoch")
    parser.add_argument("--repeats", type=int, default=3, help="model.save timings per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per size (medians)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
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
