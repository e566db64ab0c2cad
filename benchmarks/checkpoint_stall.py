"""Checkpoint stall: how long the training loop is blocked by a save, on the S3 emulator.

For each size (``--sizes-mb``, default 100 and 1000 MB) one checkpoint folder (``--files``
files of equal size, random bytes) is saved four ways against moto's S3 server (started here,
see tests/servers/emulators.py), all in one run:

- ``sync``: ``CheckpointContext.upload(dir)`` (the caller waits for the commit);
- ``background``: ``upload(dir, background=True)`` -> blocked while the folder is snapshotted
  (copied), then uploaded on a worker thread (``wait()`` time reported separately);
- ``store_path bg``: ``store_path(background=True)`` -> blocked while the folder written in the
  block is handed over (moved, no copy);
- ``boto3``: a plain ``boto3`` ``upload_file`` loop (default TransferConfig), the baseline.

Each mode runs ``--repeats`` times (interleaved, after a short settle) and the median is
reported, because the machine may be shared. Prints each mode's blocked seconds, the ratio to ``sync`` (goal for background: < 5%) and the
ratio of ``sync`` to ``boto3``. Every background checkpoint is downloaded and verified.

    .venv/bin/python benchmarks/checkpoint_stall.py --sizes-mb 100,1000
    .venv/bin/python benchmarks/checkpoint_stall.py --sizes-mb 50 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid as _uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ckptstore.checkpointing import CheckpointContext  # noqa: E402
from ckptstore.checkpointing import format as fmt  # noqa: E402
from tests.servers.emulators import create_bucket, start_server  # noqa: E402

logger = logging.getLogger("checkpoint_stall")
MiB = 2**20


def make_checkpoint(root: str, size_mb: int, files: int) -> None:
    """``files`` files of random bytes totalling ``size_mb`` MiB."""
    os.makedirs(root, exist_ok=True)
    per_file = size_mb * MiB // files
    chunk = os.urandom(16 * MiB)
    for i in range(files):
        with open(os.path.join(root, f"shard-{i:03d}.bin"), "wb") as f:
            left = per_file
            while left:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
            f.write(os.urandom(64))  # each file differs from the others


def copy_tree_into(src: str, dst: str) -> None:
    for name in os.listdir(src):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def run_size(size_mb: int, files: int, repeats: int, server, workdir: str) -> dict[str, float]:
    """Every mode ``repeats`` times, interleaved; the median of each measurement."""
    import boto3

    src = os.path.join(workdir, f"ckpt-{size_mb}")
    make_checkpoint(src, size_mb, files)
    bucket = f"stall-{_uuid.uuid4().hex[:10]}"
    create_bucket(server, bucket)
    client = boto3.client("s3", endpoint_url=server.endpoint)
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    with CheckpointContext(f"s3://{bucket}/ckpts", max_in_flight=2) as ctx:
        for _ in range(repeats):
            # sync
            settle()
            t0 = time.perf_counter()
            uuid = ctx.upload(src, {"steps_completed": 1})
            add("sync_s", time.perf_counter() - t0)
            ctx.delete(uuid)

            # background upload (snapshot, then upload on a thread)
            settle()
            t0 = time.perf_counter()
            uuid = ctx.upload(src, {"steps_completed": 2}, background=True)
            add("background_blocked_s", time.perf_counter() - t0)
            ctx.wait()
            add("background_total_s", time.perf_counter() - t0)
            verify(ctx, uuid, workdir)
            ctx.delete(uuid)

            # store_path(background=True): the folder is handed over, not copied
            cm = ctx.store_path({"steps_completed": 3}, background=True)
            path, uuid = cm.__enter__()
            copy_tree_into(src, path)  # "training writes its checkpoint" (not timed)
            settle()
            t0 = time.perf_counter()
            cm.__exit__(None, None, None)
            add("store_path_bg_blocked_s", time.perf_counter() - t0)
            ctx.wait()
            add("store_path_bg_total_s", time.perf_counter() - t0)
            verify(ctx, uuid, workdir)
            ctx.delete(uuid)

            # plain boto3 upload_file loop
            settle()
            t0 = time.perf_counter()
            for name in sorted(os.listdir(src)):
                client.upload_file(os.path.join(src, name), bucket, f"boto3/{name}")
            add("boto3_s", time.perf_counter() - t0)
            for name in os.listdir(src):
                client.delete_object(Bucket=bucket, Key=f"boto3/{name}")
    shutil.rmtree(src)
    result: dict[str, float] = {"size_mb": size_mb, "repeats": repeats}
    result.update({name: statistics.median(values) for name, values in samples.items()})
    result["samples"] = samples  # type: ignore[assignment]
    return result


def settle() -> None:
    """Let the emulator finish the previous mode's work (saves are apart in real training)."""
    os.sync()
    time.sleep(2)


def verify(ctx: CheckpointContext, uuid: str, workdir: str) -> None:
    out = tempfile.mkdtemp(dir=workdir)
    try:
        ctx.download(uuid, out)  # checks every size and crc32c
        assert fmt.is_committed(ctx.storage, uuid)
    finally:
        shutil.rmtree(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="100,1000", help="comma-separated sizes in MiB")
    parser.add_argument("--files", type=int, default=4, help="files per checkpoint")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (median)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",") if s.strip()]
    logging.basicConfig(level=logging.WARNING)
    workdir = tempfile.mkdtemp(prefix="ckptstore-stall-")
    server = start_server("s3", os.path.join(workdir, "moto"))
    os.environ.update(server.env)
    results = []
    try:
        for size in sizes:
            results.append(run_size(size, args.files, args.repeats, server, workdir))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{'size':>7} {'mode':<15} {'blocked s':>10} {'vs sync':>8} {'total s':>8}")
    for r in results:
        sync = r["sync_s"]
        rows = [
            ("sync", sync, sync),
            ("background", r["background_blocked_s"], r["background_total_s"]),
            ("store_path bg", r["store_path_bg_blocked_s"], r["store_path_bg_total_s"]),
            ("boto3 loop", r["boto3_s"], r["boto3_s"]),
        ]
        for mode, blocked, total in rows:
            print(
                f"{r['size_mb']:>5}MB {mode:<15} {blocked:>10.3f} {blocked / sync:>7.1%} "
                f"{total:>8.2f}"
            )
        r["background_vs_sync"] = r["background_blocked_s"] / sync
        r["store_path_bg_vs_sync"] = r["store_path_bg_blocked_s"] / sync
        r["sync_vs_boto3"] = sync / r["boto3_s"]
        goal = "met" if r["background_vs_sync"] < 0.05 else "NOT met"
        print(
            f"        background blocked/sync = {r['background_vs_sync']:.2%} (goal < 5%: {goal}); "
            f"store_path bg blocked/sync = {r['store_path_bg_vs_sync']:.2%}; "
            f"sync/boto3 = {r['sync_vs_boto3']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
