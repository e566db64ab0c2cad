"""Load for inference by UUID beside ``keras.models.load_model`` of the same model's ``.keras``
(issue 41), each load a fresh process, rounds interleaved, medians; wall and CPU seconds.

Setup (once per regime): :mod:`incremental`'s Dense stack of ``--mb`` MiB with Adam, (a) frozen
backbone or (b) full training, fitted one epoch with ``DeterminedCallback`` into a local store
(deduplicated: ckptstore's defaults) and saved with ``model.save`` beside it. Each worker first
builds the same model and imports what ``peers.py``'s resume process has imported before its
load (ckptstore, the registry's SQLAlchemy), then times only the load: ``load_checkpoint_model``
by UUID, or ``keras.models.load_model``. ``--baseline DIR`` adds ``ckptstore@base``: the same
load run from another checkout (``git archive <commit> | tar -x -C DIR``), in the same rounds.

    .venv/bin/python benchmarks/load_ab.py --mb 104 --regimes a,b --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
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


def setup(work: str, mb: float, frozen: bool) -> None:
    import incremental

    import ckptstore as det

    x, y = incremental.data()
    model = incremental.build(mb, frozen)
    url, reg = os.path.join(work, "store"), f"sqlite:///{work}/reg.db"
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
    url, reg = os.path.join(work, "store"), f"sqlite:///{work}/reg.db"
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
    if method == "ckptstore@base":
        repo, method = args.baseline, "ckptstore"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--work", work]
    cmd += ["--mb", str(args.mb), "--repo", repo] + (["--frozen"] if frozen else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        print(f"  {method} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=104.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--regimes", default="a,b")
    parser.add_argument("--baseline", help="another checkout: adds ckptstore@base")
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
    for regime in args.regimes.split(","):
        frozen, loads = regime == "a", []
        rows: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
        with tempfile.TemporaryDirectory(prefix=f"load-ab-{regime}-") as work:
            cmd = [sys.executable, os.path.abspath(__file__), "--setup", "--work", work]
            cmd += ["--mb", str(args.mb)] + (["--frozen"] if frozen else [])
            subprocess.run(cmd, capture_output=True, check=True)
            for _ in range(args.rounds):
                for method in methods:
                    rows[method].append(_run(args, method, work, frozen))
                    loads.append(os.getloadavg()[0])
        _report(regime, rows, loads)
    return None


def _report(regime: str, rows: dict[str, list[dict[str, float]]], loads: list[float]) -> None:
    def med(method: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[method] if r)

    print(
        f"\n({regime}) load average (1 min): median {statistics.median(loads):.1f}, max "
        f"{max(loads):.1f}; medians of {len(rows['keras'])}"
    )
    for method in rows:
        print(
            f"{method:16s} wall {med(method, 'wall'):6.2f} s ({med(method, 'wall') / med('keras', 'wall'):.2f}x)"
            f"  CPU {med(method, 'cpu'):5.2f} s ({med(method, 'cpu') / med('keras', 'cpu'):.2f}x)"
        )


if __name__ == "__main__":
    main()
