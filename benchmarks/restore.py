"""The restore cache (issue 30): bytes fetched from storage and time of a load, with the local
cache (``ckptstore.checkpointing.cache``) against a plain whole download (``cache=False``,
what every load cost before), in the same run, on the moto S3 emulator.

Two scenarios (the models and checkpoints of ``benchmarks/incremental.py``, deduplicated):

- (a) fine-tuning: a frozen Dense backbone of ``--backbone-mb`` MB and a small trained head;
- (b) full training: every layer trained (every tensor changes).

``fit()`` writes checkpoints N and N+1 (one epoch apart) through ``DeterminedCallback``. Then,
``--reps`` times, each with an empty cache: a plain whole download of N+1 (the peer), the
first load of N (empty cache), the next checkpoint N+1, and N+1 again. A load is
``CheckpointContext.download`` into a fresh folder (fetch, verify, place). Printed: median
seconds and MiB from storage of each, with the targets' ratios: next checkpoint in (a)
against the changed tensors' bytes, N+1 again against its size and the peer's time, the
first load against the peer's time.

    .venv/bin/python benchmarks/restore.py --backbone-mb 64
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.incremental import (  # noqa: E402
    SCENARIOS,
    MiB,
    build,
    changed_bytes,
    data,
    moto_s3,
)

STEPS = ("whole download (peer)", "first load N", "next checkpoint N+1", "N+1 again")


def write_checkpoints(url: str, reg: str, frozen: bool, backbone_mb: float) -> tuple[list, int]:
    """Checkpoints N and N+1 of one scenario; returns their UUIDs and the changed bytes."""
    import ckptstore as det

    x, y = data()
    model = build(backbone_mb, frozen)
    model.fit(x, y, epochs=1, verbose=0)  # optimizer state built: N+1 differs by one epoch
    with det.core.init(storage=url, registry=reg, trial_id=1, preempt_signals=False) as ctx:
        callback = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        model.fit(x, y, epochs=2, verbose=0, callbacks=[callback])
        ctx.checkpoint.wait()
        records = ctx.checkpoint.index.checkpoint_records(trial_id=1)
    uuids = [r.uuid for r in sorted(records, key=lambda r: r.steps_completed)]
    return uuids[-2:], changed_bytes(model)


def one_rep(url: str, uuids: list[str], work: str) -> dict[str, tuple[float, int, int]]:
    """``{step: (seconds, bytes from storage, bytes)}`` with an empty cache at the start."""
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing.cache import RestoreCache

    n, n1 = uuids
    cache = RestoreCache(tempfile.mkdtemp(dir=work, prefix="cache-"), limit="10GB")
    out: dict[str, tuple[float, int, int]] = {}
    with CheckpointContext(url, cache=cache) as ctx:
        for step, uuid, use in zip(STEPS, (n1, n, n1, n1), (False, True, True, True), strict=True):
            target = tempfile.mkdtemp(dir=work, prefix="load-")
            t0 = time.perf_counter()
            ctx.download(uuid, target, cache=None if use else False)
            seconds = time.perf_counter() - t0
            report = ctx.last_download
            out[step] = (seconds, report.from_storage, sum(report.files.values()))
            shutil.rmtree(target)
    shutil.rmtree(cache.root)
    return out


def report(name: str, reps: list[dict[str, tuple[float, int, int]]], changed: int) -> None:
    med = {s: [statistics.median(r[s][i] for r in reps) for i in range(3)] for s in STEPS}
    peer_s = med[STEPS[0]][0]
    print(f"\n## {name}  (changed tensors: {changed / MiB:.3f} MiB)")
    print(f"{'load':24s} {'seconds':>8s} {'x peer':>7s} {'MiB from storage':>17s} {'of size':>8s}")
    for step in STEPS:
        seconds, fetched, size = med[step]
        print(
            f"{step:24s} {seconds:8.3f} {seconds / peer_s:7.2f} {fetched / MiB:17.3f} "
            f"{fetched / size:8.4f}"
        )
    print(
        f"next checkpoint: {med[STEPS[2]][1] / changed:.2f}x the changed tensors' bytes; "
        f"N+1 again: {med[STEPS[3]][1] / med[STEPS[3]][2]:.4f} of its size, "
        f"{med[STEPS[3]][0] / peer_s:.3f}x the whole download's time; "
        f"first load {med[STEPS[1]][0] / peer_s:.2f}x the whole download's time"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone-mb", type=float, default=64.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from tests.servers.emulators import create_bucket

    with moto_s3("restore-") as (server, work):
        print(f"backbone {args.backbone_mb:g} MB, moto S3, {args.reps} reps (medians)")
        for name, frozen in SCENARIOS:
            bucket = f"restore-{'a' if frozen else 'b'}"
            create_bucket(server, bucket)
            url = f"s3://{bucket}/ckpts"
            uuids, changed = write_checkpoints(
                url, f"sqlite:///{work}/{bucket}.db", frozen, args.backbone_mb
            )
            reps = [one_rep(url, uuids, work) for _ in range(args.reps)]
            report(name, reps, changed)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
