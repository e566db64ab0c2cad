"""Load for inference by UUID beside ``keras.models.load_model`` of the same model's ``.keras``
(issue 41), each load a fresh process, rounds interleaved, medians; wall and CPU seconds.

Setup (once per regime): :mod:`incremental`'s Dense stack of ``--mb`` MiB with Adam, (a) frozen
backbone or (b) full training, fitted one epoch with ``DeterminedCallback`` into a local store
(deduplicated: ckptstore's defaults) and saved with ``model.save`` beside it. Each worker first
builds the same model and imports what ``peers.py``'s resume process has imported before its
load (ckptstore, the registry's SQLAlchemy), then times only the load: ``load_checkpoint_model``
by UUID, or ``keras.models.load_model``. ``--baseline DIR`` adds ``ckptstore@base``: the same
load run from another checkout (``git archive <commit> | tar -x -C DIR``), in the same rounds.

``--s3`` adds ``ckptstore-s3``: the same model fitted into the moto S3 emulator (the
deduplicated default), loaded by UUID in two fresh processes sharing a restore cache of their
own: the first load fills the cache from S3 (``cold``, printed apart), the second's (the
method's figure) is served by the warm cache, as the issue's target names it (with
``--baseline``, ``ckptstore-s3@base`` too).

    .venv/bin/python benchmarks/load_ab.py --mb 104 --regimes a,b --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _paths(repo: str) -> None:
    sys.path.insert(0, repo)
    sys.path.insert(0, os.path.join(repo, "benchmarks"))


def _store(work: str, *, s3: bool) -> tuple[str, str]:
    """(storage URL, registry URL) of the local store or, ``s3``, the moto bucket's."""
    if s3:
        return os.environ["LOAD_AB_S3_URL"], f"sqlite:///{work}/reg-s3.db"
    return os.path.join(work, "store"), f"sqlite:///{work}/reg.db"


def setup(work: str, mb: float, frozen: bool) -> None:
    import incremental

    import ckptstore as det

    x, y = incremental.data()
    model = incremental.build(mb, frozen)
    for s3 in (False, True) if os.environ.get("LOAD_AB_S3_URL") else (False,):
        url, reg = _store(work, s3=s3)
        with det.core.init(storage=url, registry=reg, trial_id=1, preempt_signals=False) as ctx:
            cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
            model.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
            cb.wait()
    model.save(os.path.join(work, "m.keras"))


def worker(method: str, work: str, mb: float, frozen: bool) -> dict[str, float]:
    import incremental
    import keras
    import keras_stall
    import sqlalchemy  # noqa: F401 - peers.py's resume imported it before its load

    import ckptstore as det
    from ckptstore.checkpointing import scan
    from ckptstore.storage_backends import open_storage

    incremental.build(mb, frozen)  # Keras warm, as after peers.py's resume
    url, reg = _store(work, s3=method == "ckptstore-s3")
    with open_storage(url) as store:
        uuid = scan.sort_records(scan.scan_checkpoints(store))[-1].uuid
    t0, c0 = time.perf_counter(), keras_stall.cpu_seconds()
    if method == "keras":
        keras.models.load_model(os.path.join(work, "m.keras"))
    else:
        det.load_checkpoint_model(checkpoint_uuid=uuid, storage=url, registry=reg)
    return {"wall": time.perf_counter() - t0, "cpu": keras_stall.cpu_seconds() - c0}


def _run(args: argparse.Namespace, method: str, work: str, frozen: bool) -> dict[str, float]:
    repo = os.path.dirname(HERE)
    if method.endswith("@base"):
        repo, method = args.baseline, method.removesuffix("@base")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--work", work]
    cmd += ["--mb", str(args.mb), "--repo", repo] + (["--frozen"] if frozen else [])
    if method == "ckptstore-s3":
        # a restore cache of its own, filled by a first process (its load: "cold"); the
        # second process's load, from the warm cache, is the method's
        cache = tempfile.mkdtemp(dir=work, prefix="cache-")
        cold = _worker(cmd, {**os.environ, "CKPTSTORE_CACHE_DIR": cache})
        warm = _worker(cmd, {**os.environ, "CKPTSTORE_CACHE_DIR": cache})
        shutil.rmtree(cache, ignore_errors=True)
        return {**warm, "cold": cold["wall"], "cold_cpu": cold["cpu"]} if cold and warm else {}
    return _worker(cmd, dict(os.environ))


def _worker(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        print(f"  {cmd[3]} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=104.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--regimes", default="a,b")
    parser.add_argument("--baseline", help="another checkout: adds ckptstore@base")
    parser.add_argument("--s3", action="store_true", help="adds ckptstore-s3 (moto, warm cache)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--setup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--repo", default=os.path.dirname(HERE), help=argparse.SUPPRESS)
    parser.add_argument("--frozen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _paths(args.repo)
    if args.setup:
        return setup(args.work, args.mb, args.frozen)
    if args.worker:
        print(json.dumps(worker(args.worker, args.work, args.mb, args.frozen)))
        return None
    methods = ["ckptstore", "keras"] + (["ckptstore@base"] if args.baseline else [])
    with contextlib.ExitStack() as stack:
        if args.s3:
            methods += ["ckptstore-s3"] + (["ckptstore-s3@base"] if args.baseline else [])
            _start_s3(stack)
        for regime in args.regimes.split(","):
            _regime(args, methods, regime)
    return None


def _start_s3(stack: contextlib.ExitStack) -> None:
    """The moto S3 emulator for the run (its endpoint and a bucket's URL in the environment
    the workers inherit)."""
    from incremental import moto_s3

    from tests.servers.emulators import create_bucket

    server, _root = stack.enter_context(moto_s3("load-ab-s3-"))
    create_bucket(server, "load-ab")


def _regime(args: argparse.Namespace, methods: list[str], regime: str) -> None:
    frozen, loads = regime == "a", []
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    if args.s3:
        os.environ["LOAD_AB_S3_URL"] = f"s3://load-ab/{regime}"
    with tempfile.TemporaryDirectory(prefix=f"load-ab-{regime}-") as work:
        cmd = [sys.executable, os.path.abspath(__file__), "--setup", "--work", work]
        cmd += ["--mb", str(args.mb)] + (["--frozen"] if frozen else [])
        subprocess.run(cmd, capture_output=True, check=True)
        for _ in range(args.rounds):
            for method in methods:
                rows[method].append(_run(args, method, work, frozen))
                loads.append(os.getloadavg()[0])
    _report(regime, rows, loads)


def _report(regime: str, rows: dict[str, list[dict[str, float]]], loads: list[float]) -> None:
    def med(method: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[method] if r)

    print(
        f"\n({regime}) load average (1 min): median {statistics.median(loads):.1f}, max "
        f"{max(loads):.1f}; medians of {len(rows['keras'])}"
    )
    for method in rows:
        keys = [("wall", "cpu", method)]
        if method.startswith("ckptstore-s3"):  # its first load, from S3 into an empty cache
            keys.append(("cold", "cold_cpu", "  (cold cache)"))
        for wall, cpu, name in keys:
            print(
                f"{name:16s} wall {med(method, wall):6.2f} s "
                f"({med(method, wall) / med('keras', 'wall'):.2f}x)  CPU {med(method, cpu):5.2f} s"
                f" ({med(method, cpu) / med('keras', 'cpu'):.2f}x)"
            )


if __name__ == "__main__":
    main()
