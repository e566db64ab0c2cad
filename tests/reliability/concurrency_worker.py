"""Worker processes for the concurrency tests.

``python -m tests.reliability.concurrency_worker save STORAGE REGISTRY WORKER COUNT``: save
COUNT small checkpoints into trial 1; prints the UUIDs as JSON.

``python -m tests.reliability.concurrency_worker gc STORAGE REGISTRY PROTECTED``: trial 2 —
protect PROTECTED (the checkpoint this run "resumed from"), keep restoring it on a thread,
and save 15 checkpoints with GC LatestN(1) after each commit plus explicit gc() calls from
another thread. Exit 0 when every restore verified.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading


def save(storage_url: str, registry_url: str, worker: int, count: int) -> int:
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.registry import Registry

    registry = Registry(registry_url)
    uuids = []
    with CheckpointContext(storage_url, index=registry, trial_id=1) as ctx:
        for i in range(count):
            with tempfile.TemporaryDirectory() as src:
                with open(os.path.join(src, "w.bin"), "wb") as f:
                    f.write(f"{worker}-{i}".encode() * 64)
                uuids.append(ctx.upload(src, {"steps_completed": worker * 1000 + i}))
    registry.close()
    print(json.dumps(uuids), flush=True)
    return 0


def gc_while_restoring(storage_url: str, registry_url: str, protected: str) -> int:
    from ckptstore.checkpointing import CheckpointContext, LatestN
    from ckptstore.registry import Registry

    registry = Registry(registry_url)
    ctx = CheckpointContext(
        storage_url, index=registry, trial_id=2, gc_policy=LatestN(1), gc_grace_seconds=0
    )
    ctx.protect(protected)
    stop = threading.Event()
    failures: list[str] = []

    def restore_loop() -> None:
        while not stop.is_set():
            try:
                with ctx.restore_path(protected) as path:
                    with open(os.path.join(path, "w.bin"), "rb") as f:
                        if not f.read():
                            failures.append("empty")
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(repr(exc))
                return

    def gc_loop() -> None:
        while not stop.is_set():
            try:
                ctx.gc()
            except Exception as exc:  # noqa: BLE001
                failures.append(f"gc: {exc!r}")
                return

    threads = [threading.Thread(target=restore_loop), threading.Thread(target=gc_loop)]
    for t in threads:
        t.start()
    try:
        for i in range(15):
            with tempfile.TemporaryDirectory() as src:
                with open(os.path.join(src, "w.bin"), "wb") as f:
                    f.write(b"x" * 1000)
                ctx.upload(src, {"steps_completed": 100 + i})
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        ctx.close()
        registry.close()
    if failures:
        print("FAILURES " + json.dumps(failures[:5]), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "save":
        sys.exit(save(args[1], args[2], int(args[3]), int(args[4])))
    sys.exit(gc_while_restoring(args[1], args[2], args[3]))
