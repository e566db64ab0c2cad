"""How long does a checkpoint hold up ``model.fit()`` on each Keras 3 backend? (issue 42)

Runs the same measurement once per backend, each in its own process (``KERAS_BACKEND`` must be set
before Keras is imported), in one run, and prints them side by side:

- ``model.save``: Keras's own full save of the model (weights + Adam state) to local disk, the
  yardstick;
- ``snapshot``: :func:`~ckptstore.keras_io.saving._snapshot.take_snapshot` alone (TensorFlow: a
  copy-on-write read of every variable; JAX: the trainer state synced back and copied once on the
  device, because the next step donates and deletes the arrays; PyTorch: detached copies, because
  the optimizer updates the parameters in place, into a pooled buffer set mapped in beforehand;
  ``CKPTSTORE_TORCH_POOL=0`` turns the pool off for an A/B);
- ``blocked``: what ``fit()`` waits for at a checkpoint with ``DeterminedCallback``'s defaults
  (``on_epoch_end`` + the next ``on_epoch_begin``; on PyTorch plus what the training thread
  waited for the background copy in the next step), and ``final blocked`` (the last epoch's
  ``on_epoch_end`` + ``on_train_end``, which hands the SavedModel export to the worker);
- ``fit wall`` and ``fit CPU`` (this process's threads) of each round's 3-checkpoint ``fit()``:
  what the checkpoints cost training, wherever it ran.

``--ab DIR`` runs a peer checkout's ``ckptstore`` (a ``git worktree`` of main) in turn with this
one, one round each, as ``<backend>@peer``; ``--ab NAME=VALUE`` runs this checkout with that
environment variable as the peer (``CKPTSTORE_TORCH_OVERLAP=0``: every copy on the training
thread).

``--sections`` also prints, per backend, the median milliseconds of each part of the callback's
epoch-end path on the training thread (``section:`` rows; ``--epochs 12`` gives more repeats).

Target: blocked <= 0.05x ``model.save`` on JAX and PyTorch as on TensorFlow.

    .venv/bin/python benchmarks/backend_stall.py --sizes-mb 25 --rounds 3
    .venv/bin/python benchmarks/backend_stall.py --backends tensorflow,torch
    .venv/bin/python benchmarks/backend_stall.py --backends torch --rounds 5 --ab /tmp/main-wt

JAX and PyTorch come from ``.venv-jax/`` and ``.venv-torch/`` (``scripts/setup.sh --test``) or
from the venv if installed there.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests._helpers.jax_env import backend_missing, keras_env  # noqa: E402 - after the path

BACKENDS = ("tensorflow", "jax", "torch")
KEYS = ("model.save", "snapshot", "blocked", "final blocked", "fit wall", "fit CPU")
#: ``--ab``: the folder of the peer's checkout whose ``ckptstore`` a child imports instead.
_CODE_ENV = "CKPTSTORE_BENCH_CODE"


#: What ``--sections`` times: (owner, attribute) pairs on the callback, its context and the
#: snapshot module, as the training thread calls them at an epoch end.
SECTIONS = (
    ("callback", "_report"),
    ("callback", "_save"),
    ("data", "begin_epoch"),
    ("data", "snapshot"),
    ("callback", "_training_state"),
    ("callback", "_checkpoint_metadata"),
    ("callback", "_begin_save"),
    ("snapshot", "take_snapshot"),
    ("snapshot", "_jax_copies"),
    ("writer", "submit"),
    ("train", "set_status"),
    ("train", "report_metrics"),
    ("preempt", "should_preempt"),
    # the parts of _save not listed above
    ("exports", "hook"),
    ("optimizers", "attribute_optimizers"),
    ("optimizers", "describe"),
    ("tempfile", "mkdtemp"),
    ("TrainingState", "to_json_with_cuts"),
    ("state", "capture_rng"),
    ("state", "capture_extra_variables"),
    ("layer_states", "capture"),
    ("cb_arrays", "split_arrays"),
)


def _time_sections(owners: dict, sink: dict[str, list[float]]) -> None:
    """Wrap each of :data:`SECTIONS` found in ``owners`` so its calls' seconds go to ``sink``."""
    for owner_name, attr in SECTIONS:
        owner = owners.get(owner_name)
        inner = getattr(owner, attr, None)
        if inner is None or getattr(inner, "_timed", False):
            continue

        def timed(*args, _inner=inner, _key=f"section:{owner_name}.{attr}", **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return _inner(*args, **kwargs)  # the writer's calls do not hold fit() up
            started = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                sink.setdefault(_key, []).append(time.perf_counter() - started)

        timed._timed = True
        setattr(owner, attr, timed)


def measure(
    size_mb: float, rounds: int, epochs: int, steps: int, sections: bool = False
) -> dict[str, list[float]]:
    """Every key of :data:`KEYS` per round, on the backend this process runs (a child); with
    ``sections``, also every call's seconds of each of :data:`SECTIONS`."""
    import numpy as np

    import ckptstore as det
    from benchmarks.keras_stall import WIDTH, build_model, keras_save, run_fit, timed_callback
    from ckptstore.keras_io.fit import _callback_state as state_lib
    from ckptstore.keras_io.fit import _keras_callback_state as cb_arrays
    from ckptstore.keras_io.saving import _layer_states as layer_states
    from ckptstore.keras_io.saving import _optimizers as optimizers_lib
    from ckptstore.keras_io.saving import _snapshot as snapshot_lib

    model = build_model(size_mb)
    x = np.random.default_rng(0).standard_normal((16 * steps, WIDTH), dtype=np.float32)
    run_fit(model, (x, x), 1, [])  # build + compile the step
    out: dict[str, list[float]] = {key: [] for key in KEYS}
    work = tempfile.mkdtemp(prefix="backend-stall-")
    atexit.register(shutil.rmtree, work, True)  # ~0.9 GB of saves and checkpoints per size
    layout = snapshot_lib.StateLayout.of(model)  # one, as fit() has (PyTorch reuses its copies)
    for i in range(rounds):
        started = time.perf_counter()
        keras_save(model, os.path.join(work, f"save{i}"))
        out["model.save"].append(time.perf_counter() - started)
        os.remove(os.path.join(work, f"save{i}.keras"))
        started = time.perf_counter()
        snapshot_lib.take_snapshot(layout)
        settle = getattr(snapshot_lib, "settle_buffers", None)
        if settle is not None:  # PyTorch: the background copy ends, its guard comes off
            settle(layout)
        out["snapshot"].append(time.perf_counter() - started)
        blocked: list[float] = []
        final: list[float] = []
        with det.core.init(
            storage=os.path.join(work, f"ckpts{i}"),
            registry=f"sqlite:///{work}/reg{i}.db",
            trial_id=1,
            preempt_signals=False,
        ) as ctx:
            cb = det.keras.DeterminedCallback(ctx, None, 1)
            if sections:
                owners = {"callback": cb, "snapshot": snapshot_lib, "train": ctx.train}
                owners.update(preempt=ctx.preempt, exports=cb._exports, tempfile=tempfile)
                owners.update(optimizers=optimizers_lib, cb_arrays=cb_arrays)
                owners.update(state=state_lib, TrainingState=state_lib.TrainingState)
                owners.update(layer_states=layer_states)
                _time_sections(owners, out)
                begin = cb.on_train_begin

                def on_train_begin(logs=None, _begin=begin, _cb=cb):
                    _begin(logs)  # the writer exists from here
                    _time_sections({"writer": _cb._writer, "data": _cb._data}, out)

                cb.on_train_begin = on_train_begin
            timed_callback(cb, blocked, final)
            cpu = time.process_time()  # this process's threads (not the export worker)
            wall, _with_children = run_fit(model, (x, x), epochs, [cb])
            cpu = time.process_time() - cpu
            cb.wait()
        # PyTorch: what the training thread waited for each checkpoint's background copy, in
        # the next step's guard or at the next batch end, is part of what it cost fit()
        waits = getattr(getattr(cb._layout, "__dict__", {}).get("_torch_buffers"), "waits", [])
        blocked = [b + w for b, w in zip(blocked, [*waits, *[0.0] * len(blocked)], strict=False)]
        out["fit wall"].append(wall)
        out["fit CPU"].append(cpu)
        out["blocked"].append(statistics.median(blocked))
        out["final blocked"].append(statistics.median(final))
    return out


def _child(
    backend: str, args: argparse.Namespace, code: str | None = None, rounds: int | None = None
) -> dict[str, list[float]]:
    env = keras_env(backend)  # JAX (PyTorch) from .venv-jax/ (.venv-torch/) for its child
    if code and "=" in code and not os.path.isdir(code):  # --ab NAME=VALUE: this checkout so
        name, _, value = code.partition("=")
        env[name] = value
    elif code:
        env[_CODE_ENV] = code
    extra = [] if rounds is None else ["--rounds", str(rounds)]
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *sys.argv[1:], *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{backend} run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ab_runs(backends: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """``--ab``: per backend, this checkout and the peer's (``<backend>@peer``), one round each
    in turn (interleaved: the machine's load falls on both alike)."""
    runs: dict[str, dict] = {}
    for _round in range(args.rounds):
        for backend in backends:
            for name, code in ((backend, None), (f"{backend}@peer", args.ab)):
                got = _child(backend, args, code=code, rounds=1)
                for size, values in got.items():
                    merged = runs.setdefault(name, {}).setdefault(size, {})
                    for key, seconds in values.items():
                        merged.setdefault(key, []).extend(seconds)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="25", help="comma-separated state sizes")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="training steps per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sections", action="store_true", help="time the epoch-end path's parts")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    parser.add_argument(
        "--ab",
        metavar="DIR|NAME=VALUE",
        help="also run a peer: a checkout's ckptstore (e.g. a worktree of main), or this one "
        "with an environment variable set (CKPTSTORE_TORCH_OVERLAP=0)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",") if s]
    if args.child:
        import benchmarks.keras_stall  # noqa: F401 - puts this checkout first on the path

        if os.environ.get(_CODE_ENV):  # --ab: the peer's ckptstore instead of this one
            sys.path.insert(0, os.environ[_CODE_ENV])
        results = {
            str(s): measure(s, args.rounds, args.epochs, args.steps, args.sections) for s in sizes
        }
        print(json.dumps(results))
        return 0
    backends = [b for b in args.backends.split(",") if b]
    for backend in backends:
        if backend != "tensorflow" and backend_missing(backend):
            raise SystemExit(backend_missing(backend))
    if args.ab:
        runs = _ab_runs(backends, args)
    else:
        runs = {backend: _child(backend, args) for backend in backends}
    for size in sizes:
        print(
            f"\n=== state {size:.0f} MB (weights + Adam), {args.epochs} epochs x {args.steps} "
            f"steps, median of {args.rounds} rounds, load average {os.getloadavg()[0]:.1f} ==="
        )
        print(f"{'seconds':16s}" + "".join(f"{b:>16s}{'x save':>9s}" for b in runs))
        for key in KEYS:
            row = f"{key:16s}"
            for name in runs:
                values = runs[name][str(size)]
                ratios = [a / b for a, b in zip(values[key], values["model.save"], strict=True)]
                row += f"{statistics.median(values[key]):16.4f}{statistics.median(ratios):9.3f}"
            print(row)
        _print_sections([runs[name][str(size)] for name in runs])
    return 0


def _print_sections(per_backend: list[dict[str, list[float]]]) -> None:
    """The ``--sections`` rows: median milliseconds per call and the number of calls."""
    names = sorted({key for values in per_backend for key in values if key.startswith("section:")})
    for name in names:
        row = f"{name[len('section:') :]:34s}"
        for values in per_backend:
            calls = values.get(name, [])
            median_ms = statistics.median(calls) * 1e3 if calls else float("nan")
            row += f"{median_ms:10.3f} ms x{len(calls):<4d}"
        print(row)


if __name__ == "__main__":
    sys.exit(main())
