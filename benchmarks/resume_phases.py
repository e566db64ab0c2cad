"""Where a resume's time goes, phase by phase (issue 41): ckptstore against ``BackupAndRestore``
on :mod:`peers`'s model and clock, each resume a fresh process.

``peers.py`` times a resume from ``fit()``'s start to the end of the first trained batch. This
script splits that window at the points every method shares, with the process's CPU seconds
(all threads), the main thread's own CPU seconds and wall seconds at each:

- ``begin``: ``fit()`` up to the first callback's ``on_train_begin`` (``core.init`` for
  ckptstore, Keras's epoch iterator and array pipeline);
- ``restore``: the callbacks' ``on_train_begin`` (ckptstore's restore, the writer's start);
- ``epoch``: to the first ``on_train_batch_begin`` (``on_epoch_begin``, the epoch's iterator);
- ``step``: the first batch (the train step's trace and run, the iterator's first element).

Each phase also gets the main thread's CPU seconds inside the garbage collector and the number
of full (generation-2) collections (``gc.callbacks``): a full collection of a TensorFlow
process's ~350,000 objects costs ~0.2 CPU-s, and CPython runs one once enough objects have
survived since the last. It counts the train function's traces, and with ``--profile DIR``
writes a ``cProfile`` of each resume (main-thread CPU clock) to
``DIR/<method>-<regime>-<round>.prof``. ``--preimport`` adds ``ckptstore-preimported``: the
imports of ckptstore's resume done before the clock; ``--sqlalchemy-first`` adds
``ckptstore-sqlalchemy-first``: SQLAlchemy imported before TensorFlow (an estimate of a resume
path without it). For diagnosis, ``RESUME_PHASES_OBJECTS=1``
prints the objects per GC generation at each point (slow: it disturbs the clocks) and
``RESUME_PHASES_COLLECT=1`` runs ``gc.collect()`` just before the clock. Each method's store is
written once by ``peers.py``'s train phase; ``--cold`` drops it from the page cache before each
resume; ``--baseline DIR`` adds ``ckptstore@base`` (another checkout's package, see peers.py).

    .venv/bin/python benchmarks/resume_phases.py --regimes a --rounds 5 --cold
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("PEERS_CODE"):  # ckptstore@base: bound now, before peers puts us first
    sys.path.insert(0, os.environ["PEERS_CODE"])
    import ckptstore  # noqa: E402, F401

    assert ckptstore.__file__.startswith(os.environ["PEERS_CODE"]), ckptstore.__file__
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PHASES = ("begin", "restore", "epoch", "step")
#: ``--preimport``'s method: ckptstore with its resume's imports (the registry's SQLAlchemy,
#: ``core.init``'s modules, the callback's) done before the clock, as a script that imported
#: them at its top would have them.
PREIMPORTED = "ckptstore-preimported"
_PREIMPORTS = (
    "sqlalchemy",
    "sqlalchemy.orm",
    "ckptstore.registry",
    "ckptstore.core",
    "ckptstore.keras",
)
#: ``--sqlalchemy-first``'s method: ckptstore with SQLAlchemy (and its SQLite dialect) imported
#: before TensorFlow, so that neither its import nor its objects fall in the window: its
#: objects are then among those the process's last full collection before the clock kept, not
#: new ones that make the next one due. An estimate of a registry that does not import
#: SQLAlchemy on a resume's path (a diagnosis: a script importing it first gains the same).
SQLALCHEMY_FIRST = "ckptstore-sqlalchemy-first"


_GC = {"at": 0.0, "cpu": 0.0, "runs": 0.0}


def _gc_clock(phase: str, info: dict) -> None:  # type: ignore[type-arg]
    """Main-thread CPU seconds in the garbage collector's runs (gc.callbacks)."""
    if phase == "start":
        _GC["at"] = time.thread_time()
    else:
        _GC["cpu"] += time.thread_time() - _GC["at"]
        _GC["runs"] += info.get("generation", 0) == 2


def _clocks() -> tuple[float, float, float, float, float]:
    now = time.perf_counter(), time.process_time(), time.thread_time(), _GC["cpu"], _GC["runs"]
    if os.environ.get("RESUME_PHASES_OBJECTS"):  # diagnosis only: slow, disturbs the clocks
        import gc

        print("objects", [len(gc.get_objects(g)) for g in range(3)], gc.get_count(), flush=True)
    return now


def _traces(model) -> int:  # type: ignore[no-untyped-def]
    for cell in getattr(model.train_function, "__closure__", None) or ():
        fn = cell.cell_contents
        if hasattr(fn, "experimental_get_tracing_count"):
            return int(fn.experimental_get_tracing_count())
    return -1


def resume(args) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One resume in this process, split into :data:`PHASES`."""
    if os.environ.get("RESUME_PHASES_SQLALCHEMY_FIRST"):
        import sqlalchemy.dialects.sqlite  # noqa: F401

    import incremental
    import keras
    import peers

    if args.method.startswith("ckptstore"):
        import ckptstore  # noqa: F401
    if os.environ.get("RESUME_PHASES_PREIMPORT"):
        import importlib

        for name in _PREIMPORTS:
            importlib.import_module(name)

    x, y = incremental.data()
    model = incremental.build(args.mb, args.regime == "a")
    marks: dict[str, tuple[float, float, float]] = {}

    class First(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # type: ignore[no-untyped-def]
            marks.setdefault("begin", _clocks())

    class Last(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # type: ignore[no-untyped-def]
            marks.setdefault("restore", _clocks())

        def on_train_batch_begin(self, batch, logs=None):  # type: ignore[no-untyped-def]
            marks.setdefault("epoch", _clocks())

        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            marks["step"] = _clocks()
            raise peers._Ready

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # the main thread's own CPU
    import gc

    gc.callbacks.append(_gc_clock)
    if os.environ.get("RESUME_PHASES_COLLECT"):  # diagnosis: every method from a collected heap
        gc.collect()
    start = _clocks()
    if profiler is not None:
        profiler.enable()
    with peers._callback(args.method, args.work, resume=True) as cb:
        try:
            model.fit(x, y, epochs=args.epochs + 1, verbose=0, callbacks=[First(), cb, Last()])
        except peers._Ready:
            pass
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    out: dict[str, float] = {"traces": float(_traces(model))}
    before = start
    for phase in PHASES:
        now = marks[phase]
        out[phase] = now[0] - before[0]
        out[f"{phase}_cpu"] = now[1] - before[1]
        out[f"{phase}_main"] = now[2] - before[2]
        out[f"{phase}_gc"] = now[3] - before[3]
        out[f"{phase}_gc2"] = now[4] - before[4]
        before = now
    out["total"] = marks["step"][0] - start[0]
    out["total_cpu"] = marks["step"][1] - start[1]
    return out


def _child(method: str, regime: str, work: str, args, profile: str | None) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import peers

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if method.endswith("@base"):
        env["PEERS_CODE"] = os.path.abspath(args.baseline)
        method = method.removesuffix("@base")
    if method == PREIMPORTED:
        env["RESUME_PHASES_PREIMPORT"] = "1"
        method = "ckptstore"
    if method == SQLALCHEMY_FIRST:
        env["RESUME_PHASES_SQLALCHEMY_FIRST"] = "1"
        method = "ckptstore"
    if args.cold:
        peers.drop_from_page_cache(work)
    flags = {"--worker": method, "--regime": regime, "--work": work, "--mb": args.mb}
    flags.update({"--epochs": args.epochs, **({"--profile": profile} if profile else {})})
    cmd = [sys.executable, os.path.abspath(__file__)]
    cmd += [str(part) for pair in flags.items() for part in pair]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    # the worker's one JSON line is its last line of output
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last.startswith("{"):
        return json.loads(last)
    sys.stderr.write(f"  {method} {regime} failed (exit {done.returncode}):\n")
    sys.stderr.write(done.stderr[-3000:] + "\n")
    return {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=104.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--regimes", default="a,b")
    parser.add_argument("--methods", default="ckptstore,BackupAndRestore")
    parser.add_argument("--baseline", help="another checkout: adds ckptstore@base")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--preimport", action="store_true", help=f"adds {PREIMPORTED}")
    parser.add_argument("--sqlalchemy-first", action="store_true", help=f"adds {SQLALCHEMY_FIRST}")
    parser.add_argument("--profile", help="folder for a cProfile of each resume")
    for hidden in ("--worker", "--regime", "--work"):  # the child's (see _child)
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(resume(argparse.Namespace(**vars(args), method=args.worker))))
        return
    import peers

    methods = args.methods.split(",") + (["ckptstore@base"] if args.baseline else [])
    methods += [PREIMPORTED] if args.preimport else []
    methods += [SQLALCHEMY_FIRST] if args.sqlalchemy_first else []
    root = tempfile.mkdtemp(prefix="resume-phases-")
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    loads: list[float] = []
    try:
        works = {}
        for regime in args.regimes.split(","):
            for method in methods:
                work = works[regime, method] = os.path.join(root, f"{method}-{regime}")
                os.makedirs(work)
                trained = "ckptstore" if method in (PREIMPORTED, SQLALCHEMY_FIRST) else method
                peers._run(trained, regime, "train", work, args, env)
        for round_ in range(args.rounds):
            for regime in args.regimes.split(","):
                for method in methods:
                    profile = None
                    if args.profile:
                        os.makedirs(args.profile, exist_ok=True)
                        name = f"{method.replace('@', '-')}-{regime}-{round_}.prof"
                        profile = os.path.join(os.path.abspath(args.profile), name)
                    row = _child(method, regime, works[regime, method], args, profile)
                    loads.append(os.getloadavg()[0])
                    results.setdefault((regime, method), []).append(row)
                    print(f"round {round_} {regime} {method}: {row}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(results, loads)


def report(results: dict[tuple[str, str], list[dict[str, float]]], loads: list[float]) -> None:
    def med(rows: list[dict[str, float]], key: str) -> float:
        values = [r[key] for r in rows if key in r]
        return statistics.median(values) if values else float("nan")

    print(f"\nload average (1 min): median {statistics.median(loads):.1f}, max {max(loads):.1f}")
    for (regime, method), rows in sorted(results.items()):
        cells = " ".join(
            f"{p} {med(rows, p):.3f}/{med(rows, p + '_cpu'):.3f}/{med(rows, p + '_main'):.3f}"
            f"/{med(rows, p + '_gc'):.3f}({med(rows, p + '_gc2'):.0f})"
            for p in PHASES
        )
        print(
            f"({regime}) {method:18s} total {med(rows, 'total'):.3f} s wall, "
            f"{med(rows, 'total_cpu'):.3f} CPU s; traces {med(rows, 'traces'):.0f}; "
            f"phases wall/CPU/main-thread CPU/gc CPU (gen-2 runs): {cells}"
        )


if __name__ == "__main__":
    main()
