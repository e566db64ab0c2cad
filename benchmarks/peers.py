"""ckptstore beside Keras's savers, each method in its own process (issue 41): what a
checkpoint costs in ``fit()``, what it writes, and how fast a run resumes and a model loads.

The model is :mod:`incremental`'s Dense(1024) stack of ``--mb`` MiB with Adam (3 checkpoints
per ``fit()``), in two regimes: (a) frozen backbone, trained head; (b) full training. For each
method a fresh Python process

- ``train``: trains one epoch (graph built), times ``fit()`` of ``--epochs`` epochs without
  checkpoints, then the same with the method's callback (one checkpoint per epoch) until the
  last checkpoint is committed. Printed per checkpoint: the time the callback holds ``fit()``
  (``blocked``), the whole cost (``fit()`` + commit minus the plain ``fit()``, wall and CPU
  seconds of the process and its children) and the bytes the process wrote to disk
  (``/proc/self/io`` ``write_bytes``: pages it dirtied; a deduplicating store's second copy
  shows here) beside the bytes the checkpoint added to the store;
- ``resume`` (another fresh process): builds and compiles the model, then times from
  ``fit()``'s start (``core.init`` included) to the end of the first batch of the next epoch
  (weights, optimizer state, callback state and data position restored, and one step
  trained). The clock stops after that step for every method, so each window holds the same
  work: Keras builds an optimizer that a restore has not built while it traces the first
  step, which a clock stopped at the batch's start (before session 10; still printed as
  ``to batch``) counted for ckptstore's resume and not for ``BackupAndRestore``'s. Printed
  with it: CPython's garbage collections in that window (CPU seconds, and how many were full
  ones: a full collection of this process's ~350,000 objects costs ~0.2 CPU-s);
- then, in the same process: times loading the last checkpoint for inference (``load_checkpoint_model`` by
  UUID; ``keras.models.load_model`` of the last ``ModelCheckpoint`` file for the Keras peers).

Methods: ``ckptstore`` on a local folder (its defaults: deduplicated), ``ckptstore-whole``
(``dedup=False``), ``ckptstore-s3`` (moto; the load is timed twice, the second from the warm
restore cache), Keras ``ModelCheckpoint`` and ``BackupAndRestore``, and ``OrbaxCheckpoint`` when
installed (``pip install -e .[bench]``). Rounds interleave the methods; medians are printed,
with the machine's load average and the physical floors measured in the same run: writing the
model's checkpoint bytes to a file, SHA-256 over them, and a memcpy.

``--phases train`` times the writing side alone; ``--baseline DIR`` adds ``ckptstore@base``,
the ``ckptstore`` method run by this script with the package of another checkout of the
project (``git worktree add DIR <commit>``), so a change is measured against its base in the
same run and by the same clock. ``--cold`` drops every file a method wrote from the page cache
before its resume (``fsync`` + ``posix_fadvise(DONTNEED)``, no root needed), so each method
resumes from the disk as on a new machine after a preemption; without it a method whose
checkpoint is still in the page cache reads from memory (ckptstore writes its chunks past the
page cache, so its resume reads the disk either way).

    .venv/bin/python benchmarks/peers.py --mb 104 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
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
if os.environ.get("PEERS_CODE"):
    # ckptstore@base: the baseline checkout's package, bound now (incremental and keras_stall
    # put this checkout first on sys.path when they are imported)
    sys.path.insert(0, os.environ["PEERS_CODE"])
    import ckptstore  # noqa: E402, F401

    assert ckptstore.__file__.startswith(os.environ["PEERS_CODE"]), ckptstore.__file__
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MiB = 2**20
METHODS = ("ckptstore", "ckptstore-whole", "ckptstore-s3", "BackupAndRestore", "ModelCheckpoint")


def _io_written() -> tuple[int, int]:
    """Bytes of page cache this process dirtied, and those of them it deleted before they
    reached the disk (a staged file removed after its commit)."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["write_bytes"]), int(fields["cancelled_write_bytes"])


def _tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(folder) for f in fs)


class _GcClock:
    """CPython's garbage collections (``gc.callbacks``): their CPU seconds on the thread that
    ran them, and how many were full (generation 2) ones."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        self.cpu += time.thread_time() - self._started
        self.full += info["generation"] == 2


class _Ready(Exception):
    """Raised when the first batch after a resume has been trained: the model is trained on."""


def _marker(times: dict[str, float], model, collections: _GcClock):  # type: ignore[no-untyped-def]
    import keras
    import keras_stall

    class Marker(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # type: ignore[no-untyped-def]
            times.setdefault("fit", time.perf_counter())

        def on_train_batch_begin(self, batch, logs=None):  # type: ignore[no-untyped-def]
            # the clock before session 10, kept for comparison; the optimizer's step count
            # read before the first step moves it
            times.setdefault("batch", time.perf_counter())
            times.setdefault("batch_cpu", keras_stall.cpu_seconds())
            times.setdefault("iterations", float(model.optimizer.iterations.numpy()))

        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            times["ready"] = time.perf_counter()
            times["ready_cpu"] = keras_stall.cpu_seconds()
            times["gc_cpu"], times["gc_full"] = collections.cpu, collections.full
            raise _Ready

    return Marker()


@contextlib.contextmanager
def _callback(method: str, work: str, resume: bool):  # type: ignore[no-untyped-def]
    """The method's callback (for ckptstore inside its ``core.init``)."""
    import keras

    if method == "BackupAndRestore":
        yield keras.callbacks.BackupAndRestore(os.path.join(work, "bar"), delete_checkpoint=False)
        return
    if method == "ModelCheckpoint":
        pattern = os.path.join(work, "mc", "m{epoch}.keras")
        os.makedirs(os.path.dirname(pattern), exist_ok=True)
        yield keras.callbacks.ModelCheckpoint(pattern)
        return
    if method == "OrbaxCheckpoint":
        yield keras.callbacks.OrbaxCheckpoint(os.path.join(work, "orbax"))
        return
    import ckptstore as det

    url = os.environ["PEERS_S3_URL"] if method == "ckptstore-s3" else os.path.join(work, "store")
    reg = f"sqlite:///{work}/reg.db"
    with det.core.init(storage=url, registry=reg, trial_id=1, preempt_signals=False) as ctx:
        if method == "ckptstore-whole":
            ctx.checkpoint.dedup = False
        latest = ctx.checkpoint.latest_checkpoint() if resume else None
        cb = det.keras.DeterminedCallback(ctx, latest, 1, export_saved_model="never")
        yield cb
        cb.wait()


def worker(args) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import incremental
    import keras_stall

    if args.method.startswith("ckptstore"):
        import ckptstore  # noqa: F401 - imported by the script before fit(), as users do

    x, y = incremental.data()
    model = incremental.build(args.mb, args.regime == "a")
    out: dict[str, float] = {}
    if args.phase == "resume":
        # from nothing: core.init included; CPU seconds too (steadier than wall on a busy machine)
        collections = _GcClock()  # what the window's allocations cost in collections
        gc.callbacks.append(collections)
        times = {"fit": time.perf_counter(), "fit_cpu": keras_stall.cpu_seconds()}
        with _callback(args.method, args.work, resume=True) as cb:
            try:
                marker = _marker(times, model, collections)
                model.fit(x, y, epochs=args.epochs + 1, verbose=0, callbacks=[cb, marker])
            except _Ready:
                pass
        out["resume"] = times["ready"] - times["fit"]
        out["resume_cpu"] = times["ready_cpu"] - times["fit_cpu"]
        out["to_batch"] = times["batch"] - times["fit"]
        out["to_batch_cpu"] = times["batch_cpu"] - times["fit_cpu"]
        out["resume_gc_cpu"], out["resume_gc_full"] = times["gc_cpu"], times["gc_full"]
        # Keras 3's BackupAndRestore loads before fit() builds the optimizer: its state is
        # then skipped with a warning, so that resume reads the weights alone.
        out["optimizer_restored"] = float(times["iterations"] > 0)
        return _load(args, out)
    model.fit(x, y, epochs=1, verbose=0)
    t0, c0 = time.perf_counter(), keras_stall.cpu_seconds()
    model.fit(x, y, epochs=args.epochs, verbose=0)
    plain, plain_cpu = time.perf_counter() - t0, keras_stall.cpu_seconds() - c0
    blocked: list[float] = []
    final: list[float] = []
    w0, t0, c0 = _io_written(), time.perf_counter(), keras_stall.cpu_seconds()
    with _callback(args.method, args.work, resume=False) as cb:
        # once per run, not per checkpoint (core.init, the callback): counted in cost, shown apart
        out["init"] = (time.perf_counter() - t0) / args.epochs
        out["init_cpu"] = (keras_stall.cpu_seconds() - c0) / args.epochs
        keras_stall.timed_callback(cb, blocked, final)
        model.fit(x, y, epochs=args.epochs, verbose=0, callbacks=[cb])
    n = args.epochs
    out["cost"] = (time.perf_counter() - t0 - plain) / n
    out["cpu"] = (keras_stall.cpu_seconds() - c0 - plain_cpu) / n
    out["blocked"] = statistics.median(blocked + final)
    w1 = _io_written()
    out["dirtied"] = (w1[0] - w0[0]) / n
    out["written"] = (w1[0] - w1[1] - w0[0] + w0[1]) / n
    out["state_mib"] = keras_stall.state_mb(model)
    if args.method in ("ckptstore", "ckptstore-whole"):
        out["stored"] = _tree_bytes(os.path.join(args.work, "store")) / n
    elif args.method != "ckptstore-s3":
        out["stored"] = _tree_bytes(args.work) / n
    return out


def _load(args, out: dict[str, float]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import keras
    import keras_stall

    if args.method.startswith("ckptstore"):
        import ckptstore as det

        url = (
            os.environ["PEERS_S3_URL"]
            if args.method == "ckptstore-s3"
            else os.path.join(args.work, "store")
        )
        reg = f"sqlite:///{args.work}/reg.db"
        from ckptstore.checkpointing import scan
        from ckptstore.storage_backends import open_storage

        with open_storage(url) as store:
            uuid = scan.sort_records(scan.scan_checkpoints(store))[-1].uuid
        for key in ("load", "load_warm") if args.method == "ckptstore-s3" else ("load",):
            t0, c0 = time.perf_counter(), keras_stall.cpu_seconds()
            det.load_checkpoint_model(checkpoint_uuid=uuid, storage=url, registry=reg)
            out[key] = time.perf_counter() - t0
            out[f"{key}_cpu"] = keras_stall.cpu_seconds() - c0
    elif args.method == "ModelCheckpoint":
        t0, c0 = time.perf_counter(), keras_stall.cpu_seconds()
        keras.models.load_model(os.path.join(args.work, "mc", f"m{args.epochs}.keras"))
        out["load"] = time.perf_counter() - t0
        out["load_cpu"] = keras_stall.cpu_seconds() - c0
    return out


def floors(state_bytes: int, work: str) -> dict[str, float]:
    """Seconds to write ``state_bytes`` to a new file (page cache, no fsync), SHA-256 them,
    and copy them in memory."""
    import numpy as np

    data = np.random.default_rng(0).integers(0, 255, state_bytes, dtype=np.uint8)
    path = os.path.join(work, "floor.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(memoryview(data))
    write = time.perf_counter() - t0
    os.unlink(path)
    t0 = time.perf_counter()
    hashlib.sha256(memoryview(data)).digest()
    sha = time.perf_counter() - t0
    t0 = time.perf_counter()
    data.copy()
    return {"write": write, "sha256": sha, "memcpy": time.perf_counter() - t0}


def drop_from_page_cache(folder: str) -> None:
    """Every file under ``folder`` written to the disk and dropped from the page cache."""
    for where, _dirs, files in os.walk(folder):
        for name in files:
            try:
                fd = os.open(os.path.join(where, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _run(method: str, regime: str, phase: str, work: str, args, env) -> dict[str, float]:  # type: ignore[no-untyped-def]
    if phase == "resume" and args.cold:
        drop_from_page_cache(work)
    env = dict(env)
    if method.endswith("@base"):
        # the same method and this script's clock, with the baseline checkout's ckptstore
        env["PEERS_CODE"] = os.path.abspath(args.baseline)
        method = method.removesuffix("@base")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--regime", regime]
    cmd += ["--phase", phase, "--work", work, "--mb", str(args.mb), "--epochs", str(args.epochs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        print(f"  {method} {regime} {phase} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=104.0, help="backbone MiB")
    parser.add_argument("--epochs", type=int, default=3, help="checkpoints per fit()")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--regimes", default="a,b")
    parser.add_argument("--phases", default="train,resume", help="train, resume or both")
    parser.add_argument("--baseline", help="another checkout: adds ckptstore@base")
    parser.add_argument("--cold", action="store_true", help="resume with a cold page cache")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--regime", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.method = args.worker
        print(json.dumps(worker(args)))
        return
    methods = args.methods.split(",")
    if args.baseline:
        methods.append("ckptstore@base")
    try:
        import orbax.checkpoint  # noqa: F401

        methods.append("OrbaxCheckpoint")
    except ImportError:
        print("OrbaxCheckpoint: not installed (pip install -e .[bench]); left out")
    from incremental import moto_s3

    from tests.servers.emulators import create_bucket

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    loads: list[float] = []
    with moto_s3("peers-") as (server, root):
        env = dict(os.environ)
        # An installed package has its bytecode; a checkout run without it recompiles every
        # ckptstore module at each start, which no user pays (seconds of the resume).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for round_ in range(args.rounds):
            for regime in args.regimes.split(","):
                for method in methods:
                    work = tempfile.mkdtemp(dir=root, prefix=f"{method}-{regime}-")
                    bucket = f"peers-{regime}-{round_}-{method.lower().replace('@', '-')}"
                    if method == "ckptstore-s3":
                        create_bucket(server, bucket)
                    env["PEERS_S3_URL"] = f"s3://{bucket}/ckpts"
                    row: dict[str, float] = {}
                    for phase in args.phases.split(","):
                        row.update(_run(method, regime, phase, work, args, env))
                    row.update(
                        {
                            f"floor_{k}": v
                            for k, v in floors(
                                int(row.get("state_mib", args.mb) * MiB), root
                            ).items()
                        }
                    )
                    loads.append(os.getloadavg()[0])
                    results.setdefault((regime, method), []).append(row)
                    shutil.rmtree(work, ignore_errors=True)
                    print(f"round {round_} {regime} {method}: {row}", flush=True)
    report(results, loads)


def report(results: dict[tuple[str, str], list[dict[str, float]]], loads: list[float]) -> None:
    def med(rows: list[dict[str, float]], key: str) -> float:
        values = [r[key] for r in rows if key in r]
        return statistics.median(values) if values else float("nan")

    print(
        f"\nload average (1 min) during the run: median {statistics.median(loads):.1f}, "
        f"max {max(loads):.1f}"
    )
    for regime in sorted({r for r, _m in results}):
        rows = {m: rs for (r, m), rs in results.items() if r == regime}
        bar = rows.get("BackupAndRestore", [])
        mc = rows.get("ModelCheckpoint", [])
        print(f"\n## ({regime}) {'frozen backbone' if regime == 'a' else 'full training'}")
        print(
            "per checkpoint; 'init' is the run's one-time setup (core.init, the callback) "
            "spread over its checkpoints, included in 'cost' and 'CPU'"
        )
        for method, rs in rows.items():
            if any("init" in r for r in rs):
                minus = med([dict(r, c=r["cost"] - r["init"]) for r in rs if "init" in r], "c")
                print(
                    f"  {method}: init {med(rs, 'init'):.3f} s ({med(rs, 'init_cpu'):.2f} CPU s);"
                    f" cost less init {minus:.3f} s = {minus / med(bar, 'cost'):.2f}x BaR"
                    if bar
                    else ""
                )
        print(
            f"{'method':18s} {'blocked s':>9s} {'cost s':>7s} {'x BaR':>6s} {'CPU s':>6s} "
            f"{'x BaR':>6s} {'MiB wr':>7s} {'MiB st':>7s} {'wr/st':>6s} {'resume':>7s} "
            f"{'x BaR':>6s} {'opt':>4s} {'load s':>7s} {'x k.load':>8s}"
        )
        for method, rs in rows.items():

            def ratio(key: str, peer: list[dict[str, float]], rs=rs) -> float:
                return med(rs, key) / med(peer, key) if peer else float("nan")

            load = med(rs, "load_warm") if method == "ckptstore-s3" else med(rs, "load")
            print(
                f"{method:18s} {med(rs, 'blocked'):9.3f} {med(rs, 'cost'):7.3f} "
                f"{ratio('cost', bar):6.2f} {med(rs, 'cpu'):6.2f} {ratio('cpu', bar):6.2f} "
                f"{med(rs, 'written') / MiB:7.1f} {med(rs, 'stored') / MiB:7.2f} "
                f"{med(rs, 'written') / med(rs, 'stored'):6.2f} {med(rs, 'resume'):7.3f} "
                f"{ratio('resume', bar):6.2f} {med(rs, 'optimizer_restored'):4.0f} {load:7.3f} "
                f"{load / med(mc, 'load') if mc else float('nan'):8.2f}"
            )
        every = [r for rs in rows.values() for r in rs]
        print(
            f"floors for the state ({med(every, 'state_mib'):.0f} MiB): write "
            f"{med(every, 'floor_write'):.3f} s, SHA-256 {med(every, 'floor_sha256'):.3f} s, "
            f"memcpy {med(every, 'floor_memcpy'):.3f} s"
        )
        for method, rs in rows.items():
            print(
                f"  {method}: MiB dirtied per checkpoint {med(rs, 'dirtied') / MiB:.1f} "
                f"(written minus deleted before writeback: {med(rs, 'written') / MiB:.1f})"
            )
        for method, rs in rows.items():
            load_key = "load_warm_cpu" if method == "ckptstore-s3" else "load_cpu"
            print(
                f"  {method}: to the first batch's start (the clock before session 10) "
                f"{med(rs, 'to_batch'):.3f} s, {med(rs, 'to_batch_cpu'):.2f} CPU s"
            )
            print(
                f"  {method}: CPU s to resume {med(rs, 'resume_cpu'):.2f} "
                f"({med(rs, 'resume_cpu') / med(bar, 'resume_cpu') if bar else float('nan'):.2f}x "
                f"BaR), to load {med(rs, load_key):.2f} "
                f"({med(rs, load_key) / med(mc, 'load_cpu') if mc else float('nan'):.2f}x k.load)"
            )
            print(
                f"  {method}: in the resume, garbage collections {med(rs, 'resume_gc_cpu'):.2f} "
                f"CPU s, full ones {med(rs, 'resume_gc_full'):.0f}"
            )


if __name__ == "__main__":
    main()
