"""A saving process for the SIGKILL tests: resumes from the latest checkpoint, then saves in a
loop and SIGKILLs *itself* at a chosen point.

Usage: ``python -m tests.reliability.crash_worker STORAGE REGISTRY PHASE N``

PHASE picks where the N-th event kills the process:

- ``serialize``: while writing checkpoint files locally (per 64 KiB chunk);
- ``upload``: before the N-th file transfer to storage (mid-upload: earlier files are there);
- ``manifest``: between the files/metadata and the MANIFEST.json commit;
- ``gc``: at the N-th storage delete made by garbage collection;
- ``registry``: at the N-th registry write (half the time before it, half after it);
- ``none``: no hook (the parent kills at a random delay).

Exit codes: 0 after MAX_SAVES saves (other phases), 3 when resume found a bad checkpoint.
"""

from __future__ import annotations

import os
import random
import signal
import sys

MAX_SAVES = 12
CHUNK = 64 * 1024


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def content(step: int, name: str) -> bytes:
    size = {"weights.bin": 300_000, "nested/optimizer.bin": 150_000}.get(name, 100)
    return random.Random(f"{step}-{name}").randbytes(size)


NAMES = ("weights.bin", "nested/optimizer.bin", "step.txt")


def main(argv: list[str]) -> int:
    storage_url, registry_url, phase, n = argv[0], argv[1], argv[2], int(argv[3])
    from ckptstore.checkpointing import CheckpointContext, LatestN, commit
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import open_storage

    counter = {"n": 0}

    def tick() -> None:
        counter["n"] += 1
        if counter["n"] >= n:
            die()

    registry = Registry(registry_url)
    storage = open_storage(storage_url)
    # Whole files: the kill points are the whole-file commit's steps (the deduplicated
    # commit's are killed in tests/checkpointing/test_sigkill.py).
    ctx = CheckpointContext(
        storage,
        index=registry,
        trial_id=1,
        gc_policy=LatestN(2),
        gc_grace_seconds=3600,
        dedup=False,
    )
    # ---- resume: the latest checkpoint must be complete and hold what its metadata says
    start = 0
    latest = ctx.latest_checkpoint()
    if latest is not None:
        with ctx.restore_path(latest) as path:
            step = int(ctx.get_metadata(latest)["steps_completed"])
            for name in NAMES:
                with open(os.path.join(path, *name.split("/")), "rb") as f:
                    expected = content(step, name) if name != "step.txt" else str(step).encode()
                    if f.read() != expected:
                        print(f"BAD CONTENT {latest} {name}", flush=True)
                        return 3
        start = step
    print(f"READY {start}", flush=True)

    # ---- hooks
    if phase == "upload":
        cls = type(storage)
        original_upload = cls._upload_file

        def upload_file(self, name, path, size):
            tick()
            return original_upload(self, name, path, size)

        cls._upload_file = upload_file
        # Local storage renames staged folders; make it upload so there is a transfer to cut.
        type(storage).rename_dir_into = lambda self, local_dir, key: False
    elif phase == "manifest":
        original_manifest = commit.write_manifest

        def write_manifest(*args, **kwargs):
            tick()
            return original_manifest(*args, **kwargs)

        commit.write_manifest = write_manifest
    elif phase == "gc":
        original_delete = commit.delete_checkpoint

        def delete_checkpoint(storage_, uuid, index=None):
            storage_.delete(f"{uuid}/MANIFEST.json")
            tick()  # after the uncommit, before the files and the index
            storage_.delete(uuid)
            tick()  # files gone, index not yet updated
            return original_delete(storage_, uuid, index)

        commit.delete_checkpoint = delete_checkpoint
    elif phase == "registry":
        for method in ("record_checkpoint", "set_checkpoint_state"):
            original = getattr(registry, method)

            def hooked(*args, _original=original, **kwargs):
                before = random.random() < 0.5
                if before:
                    tick()
                result = _original(*args, **kwargs)
                if not before:
                    tick()
                return result

            setattr(registry, method, hooked)

    # ---- save loop
    saves = 100_000 if phase == "none" else MAX_SAVES  # "none" runs until killed from outside
    for step in range(start + 1, start + 1 + saves):
        with ctx.store_path({"steps_completed": step}) as (path, _uuid):
            for name in NAMES:
                full = os.path.join(path, *name.split("/"))
                os.makedirs(os.path.dirname(full), exist_ok=True)
                data = content(step, name) if name != "step.txt" else str(step).encode()
                with open(full, "wb") as f:
                    for i in range(0, len(data), CHUNK):
                        f.write(data[i : i + CHUNK])
                        if phase == "serialize":
                            f.flush()
                            tick()
        ctx.wait()
    ctx.close()
    registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
