"""Saves checkpoints in a loop until killed (run as ``python -m tests.checkpointing.kill_worker
URL SEED [dedup]``). Prints ``ready`` once saving starts. With ``dedup`` the checkpoints share
content-addressed blobs and GC (keep the latest 2) deletes checkpoints and sweeps
blobs after every commit (a grace period as in real use: no upload of this process is older), while background uploads are in flight."""

from __future__ import annotations

import os
import random
import sys
import tempfile

from ckptstore.checkpointing import CheckpointContext, LatestN


def write_files(folder: str, rng: random.Random, step: int) -> None:
    for i in range(rng.randint(1, 4)):
        sub = os.path.join(folder, f"part{i % 2}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"f{i}.bin"), "wb") as f:
            f.write(rng.randbytes(rng.randint(1, 2**20)))
    with open(os.path.join(folder, "step.txt"), "w") as f:
        f.write(str(step))


def main() -> None:
    url, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    if sys.argv[3:] == ["dedup"]:
        ctx = CheckpointContext(
            url,
            trial_id=1,
            max_in_flight=2,
            dedup=True,
            dedup_chunk_bytes=2**16,
            gc_policy=LatestN(2),
            gc_grace_seconds=60,
        )
    else:
        ctx = CheckpointContext(url, trial_id=1, max_in_flight=2)
    src = tempfile.mkdtemp()
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        meta = {"steps_completed": step}
        how = step % 3
        if how == 0:
            with ctx.store_path(meta) as (path, _uuid):
                write_files(path, rng, step)
        else:
            write_files(src, rng, step)
            ctx.upload(src, meta, background=how == 2)


if __name__ == "__main__":
    main()
