"""The restore cache's extra SHA-256 pass (issue 40): what a first load into an empty cache
costs against the same load without the cache, and the pass itself against a plain copy of
the same bytes, in the same run.

Each new cache entry is read once more after it is placed and its SHA-256 recorded (what a
later whole-file hit must match once the file's identity changed,
``RestoreCache.record``). Checkpoints of ``--mb`` MB of random bytes (one file, as a
``model.keras`` of that size, plus a small one), deduplicated and whole-file, on a local store
and on the moto S3 emulator. Then, ``--reps`` times, each with an empty cache:

- plain load: ``CheckpointContext.download(uuid, dir, cache=False)`` (the peer);
- first load: the same download with an empty cache (fetch, verify, place, insert: the
  extra SHA-256 pass included);
- SHA-256 pass: ``checksums.file_sums(path, sha256=True)`` over the loaded files (the pass
  ``record`` makes for each new entry), timed alone;
- plain copy: ``shutil.copyfile`` of the loaded files into a new folder.

Printed: medians in seconds, and the ratios first load / plain load, SHA-256 pass / plain
load, SHA-256 pass / plain copy.

    .venv/bin/python benchmarks/cache_insert.py --mb 64 --reps 5
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

from benchmarks.incremental import MiB, moto_s3  # noqa: E402

STEPS = ("plain load", "first load (cache)", "SHA-256 pass", "plain copy")


def _files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


def write_checkpoint(url: str, work: str, mb: float, dedup: bool) -> str:
    from ckptstore.checkpointing import CheckpointContext

    src = tempfile.mkdtemp(dir=work, prefix="src-")
    with open(os.path.join(src, "model.keras"), "wb") as f:
        f.write(os.urandom(int(mb * MiB)))  # weights do not compress or repeat
    with open(os.path.join(src, "callback_state.json"), "wb") as f:
        f.write(b'{"epoch": 1}')
    with CheckpointContext(url, dedup=dedup) as ctx:
        uuid = ctx.upload(src, {"steps_completed": 1})
    shutil.rmtree(src)
    return uuid


def one_rep(url: str, uuid: str, work: str) -> dict[str, float]:
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing.cache import RestoreCache
    from ckptstore.checkpointing.checksums import file_sums

    cache = RestoreCache(tempfile.mkdtemp(dir=work, prefix="cache-"), limit="10GB")
    out: dict[str, float] = {}
    with CheckpointContext(url, cache=cache) as ctx:
        plain = tempfile.mkdtemp(dir=work, prefix="plain-")
        t0 = time.perf_counter()
        ctx.download(uuid, plain, cache=False)
        out[STEPS[0]] = time.perf_counter() - t0
        cached = tempfile.mkdtemp(dir=work, prefix="cached-")
        t0 = time.perf_counter()
        ctx.download(uuid, cached)
        out[STEPS[1]] = time.perf_counter() - t0
        assert ctx.last_download.from_cache == 0, "the cache was not empty"
    t0 = time.perf_counter()
    for path in _files(cached):
        file_sums(path, sha256=True)
    out[STEPS[2]] = time.perf_counter() - t0
    copy = tempfile.mkdtemp(dir=work, prefix="copy-")
    t0 = time.perf_counter()
    for i, path in enumerate(_files(plain)):
        shutil.copyfile(path, os.path.join(copy, str(i)))
    out[STEPS[3]] = time.perf_counter() - t0
    for folder in (plain, cached, copy, str(cache.root)):
        shutil.rmtree(folder, ignore_errors=True)
    return out


def report(name: str, reps: list[dict[str, float]]) -> None:
    med = {s: statistics.median(r[s] for r in reps) for s in STEPS}
    print(f"\n## {name}")
    for step in STEPS:
        print(f"{step:22s} {med[step]:8.3f} s")
    print(
        f"first load / plain load: {med[STEPS[1]] / med[STEPS[0]]:.2f}x; "
        f"SHA-256 pass / plain load: {med[STEPS[2]] / med[STEPS[0]]:.2f}x; "
        f"SHA-256 pass / plain copy: {med[STEPS[2]] / med[STEPS[3]]:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=64.0)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from tests.servers.emulators import create_bucket

    with moto_s3("cache-insert-") as (server, work):
        print(f"{args.mb:g} MB checkpoint, {args.reps} reps (medians)")
        for dedup in (True, False):
            create_bucket(server, bucket := f"cache-{'dedup' if dedup else 'whole'}")
            layout = "deduplicated" if dedup else "whole-file"
            for where, url in (
                ("local store", os.path.join(work, f"store-{layout}")),
                ("moto S3", f"s3://{bucket}/ckpts"),
            ):
                uuid = write_checkpoint(url, work, args.mb, dedup)
                reps = [one_rep(url, uuid, work) for _ in range(args.reps)]
                report(f"{where}, {layout}", reps)
                sys.stdout.flush()


if __name__ == "__main__":
    main()
