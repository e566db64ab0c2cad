"""A deleting process for the SIGKILL-mid-delete tests: deletes one checkpoint and SIGKILLs
itself at a chosen step of the delete protocol.

Usage: ``python -m tests.reliability.delete_worker STORAGE REGISTRY UUID POINT``

POINT: ``marked`` (row DELETING, nothing removed), ``uncommitted`` (manifest removed, files
left), ``removed`` (files removed, row not finished).
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    storage_url, registry_url, uuid, point = argv
    from ckptstore.checkpointing import CheckpointContext, commit
    from ckptstore.registry import Registry

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    registry = Registry(registry_url)
    original_state = registry.set_checkpoint_state
    original_remove = commit.remove_files

    def set_state(uuid_: str, state: str, resources=None) -> None:
        original_state(uuid_, state, resources)
        if point == "marked" and state == "DELETING":
            die()

    def remove_files(storage, uuid_: str) -> None:
        if point == "uncommitted":
            storage.delete(f"{uuid_}/MANIFEST.json")
            die()
        original_remove(storage, uuid_)
        if point == "removed":
            die()

    registry.set_checkpoint_state = set_state  # type: ignore[method-assign]
    commit.remove_files = remove_files
    ctx = CheckpointContext(storage_url, index=registry, trial_id=1)
    ctx.delete(uuid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
