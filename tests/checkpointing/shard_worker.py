"""One rank of a multi-process test (run as ``python -m tests.checkpointing.shard_worker``).

Writes a JSON result to ``--out``: what the rank saw, or the error type it raised.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from ckptstore.checkpointing import CheckpointContext, ProcessGroup


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rank = args.rank
    dist = ProcessGroup(
        rank=rank,
        size=args.size,
        local_rank=rank % 2,
        local_size=2,
        cross_rank=rank // 2,
        cross_size=(args.size + 1) // 2,
        port=args.port,
        timeout=60,
    )
    result: dict = {"rank": rank}
    try:
        if args.mode == "collectives":
            result["allgather"] = dist.allgather({"r": rank})
            result["gather"] = dist.gather(rank * 10)
            result["broadcast"] = dist.broadcast(f"from-{rank}")
            result["allgather_local"] = dist.allgather_local(rank)
            result["broadcast_local"] = dist.broadcast_local(f"local-{rank}")
            dist.barrier()
        else:
            ctx = CheckpointContext(args.url, distributed=dist, trial_id=9)
            metadata = {"steps_completed": 5, "shared": {f"r{rank}": rank}}
            if args.mode == "meta_conflict":
                metadata["steps_completed"] = rank
            if args.mode == "bad_metadata":  # refused by the JSON policy on the chief
                deep: object = 1
                for _ in range(200):
                    deep = [deep]
                metadata["deep"] = deep
            if args.mode == "store_path":
                with ctx.store_path(metadata, shard=True) as (path, uuid):
                    _write(os.path.join(path, f"rank{rank}", "w.bin"), bytes([rank]) * 100)
            else:
                src = tempfile.mkdtemp()
                name = "same.bin" if args.mode == "conflict" else f"rank{rank}/w.bin"
                if args.mode == "bad_name" and rank == 1:
                    name = "back\\slash.bin"  # refused by the one content rule
                _write(os.path.join(src, name), bytes([rank]) * 100)
                if rank == 0:
                    _write(os.path.join(src, "common.txt"), b"chief")
                uuid = ctx.upload(src, metadata, shard=True)
            result["uuid"] = uuid
            result["latest"] = ctx.latest_checkpoint()
            ctx.close()
        result["error"] = None
    except Exception as exc:
        result["error"] = type(exc).__name__
        result["message"] = str(exc)
    finally:
        dist.close()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
