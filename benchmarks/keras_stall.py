"""How long does checkpointing hold up ``model.fit()``? DeterminedCallback vs Keras's own savers.

For each model size (weights + Adam state, e.g. ~100 MB and ~400 MB) this prints, in one run:

- ``model.save`` to local disk (the yardstick);
- the synchronous peer: ``model.save`` to a local folder, then upload it to the S3 emulator;
- time ``fit()`` is blocked per checkpoint (time spent inside the callback's ``on_epoch_end``)
  for DeterminedCallback to the S3 emulator and to local disk, Keras's ``BackupAndRestore`` and
  ``ModelCheckpoint`` (and ``OrbaxCheckpoint`` when ``orbax`` is installed);
- the whole cost: fit() wall time with a checkpoint every epoch minus the same fit() without
  checkpoints, per checkpoint, on local disk (background work also slows the training steps).

Goals (issue 4): blocked <= 0.25x model.save and >= 5x less than save-then-upload; whole cost
<= 0.5x model.save.

    .venv/bin/python benchmarks/keras_stall.py --sizes-mb 100,400
"""

from __future__ import annotations

import argparse
import logging
import os
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


def run_fit(model, data, epochs: int, callbacks: list) -> float:
    x, y = data
    started = time.perf_counter()
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_size(size_mb: float, args, s3_url: str, work: str) -> dict[str, float]:
    import keras

    import ckptstore as det
    from ckptstore.checkpointing import CheckpointContext

    model = build_model(size_mb)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16 * args.steps, WIDTH), dtype=np.float32)
    data = (x, x)
    run_fit(model, data, 1, [])  # build + warm up
    mb = state_mb(model)
    out: dict[str, float] = {"state_mb": mb}

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
            ckpt.upload(d, {"steps_completed": 0})
            shutil.rmtree(d)
            sync.append(time.perf_counter() - t0)
    out["save+upload (sync)"] = median(sync)

    def det_run(storage: str, epochs: int, tag: str) -> tuple[float, list[float]]:
        blocked: list[float] = []
        reg = f"sqlite:///{work}/reg-{tag}.db"
        with det.core.init(storage=storage, registry=reg, trial_id=1, preempt_signals=False) as ctx:
            cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
            timed_epoch_end(cb, blocked)
            wall = run_fit(model, data, epochs, [cb])
        return wall, blocked

    _, blocked = det_run(s3_url, args.epochs, "s3")
    out["DeterminedCallback S3 blocked"] = median(blocked)
    local_dir = os.path.join(work, "local-ckpts")
    wall_det, blocked = det_run(local_dir, args.epochs, "local")
    out["DeterminedCallback local blocked"] = median(blocked)

    peers = {
        "BackupAndRestore": lambda: keras.callbacks.BackupAndRestore(
            os.path.join(work, "bar"), delete_checkpoint=True
        ),
        "ModelCheckpoint": lambda: keras.callbacks.ModelCheckpoint(
            os.path.join(work, "mc-{epoch}.keras")
        ),
    }
    try:
        import orbax.checkpoint  # noqa: F401

        peers["OrbaxCheckpoint"] = lambda: keras.callbacks.OrbaxCheckpoint(
            os.path.join(work, "orbax")
        )
    except ImportError:
        logging.info("orbax not installed: OrbaxCheckpoint peer skipped")
    walls: dict[str, float] = {}
    for name, make in peers.items():
        blocked = []
        cb = make()
        timed_epoch_end(cb, blocked)
        walls[name] = run_fit(model, data, args.epochs, [cb])
        out[f"{name} blocked"] = median(blocked)
        for leftover in ("bar", "orbax"):
            shutil.rmtree(os.path.join(work, leftover), ignore_errors=True)
        for f in os.listdir(work):
            if f.startswith("mc-"):
                os.remove(os.path.join(work, f))

    wall_none = median([run_fit(model, data, args.epochs, []) for _ in range(2)])
    out["fit() no checkpoints"] = wall_none
    out["whole cost DeterminedCallback local"] = (wall_det - wall_none) / args.epochs
    for name, wall in walls.items():
        out[f"whole cost {name}"] = (wall - wall_none) / args.epochs
    shutil.rmtree(local_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="100,400", help="comma-separated state sizes")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30, help="training steps per epoch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from tests.servers.emulators import create_bucket, start_server

    work = tempfile.mkdtemp(prefix="keras-stall-")
    server = start_server("s3", os.path.join(work, "s3"))
    try:
        os.environ.update(server.env)
        create_bucket(server, "stall")
        for size in [float(s) for s in args.sizes_mb.split(",") if s]:
            size_work = tempfile.mkdtemp(dir=work)
            r = bench_size(size, args, f"s3://stall/{int(size)}mb", size_work)
            save = r["model.save"]
            print(
                f"\n=== model state {r['state_mb']:.0f} MB (weights + Adam), "
                f"{args.epochs} epochs x {args.steps} steps ==="
            )
            print(f"{'measure':45s} {'seconds':>9s} {'x model.save':>13s}")
            for key, value in r.items():
                if key == "state_mb":
                    continue
                print(f"{key:45s} {value:9.3f} {value / save:13.2f}")
            det_s3 = r["DeterminedCallback S3 blocked"]
            print(
                f"goal blocked <= 0.25x model.save: {det_s3 / save:.2f}x; "
                f"sync save+upload / blocked: {r['save+upload (sync)'] / det_s3:.1f}x (goal >= 5x); "
                f"whole cost {r['whole cost DeterminedCallback local'] / save:.2f}x (goal <= 0.5x)"
            )
            shutil.rmtree(size_work, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
