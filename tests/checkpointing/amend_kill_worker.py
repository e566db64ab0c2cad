"""Adds files to a committed checkpoint and SIGKILLs *itself* at a chosen point (run as
``python -m tests.checkpointing.amend_kill_worker URL UUID SRC_DIR POINT [REGISTRY]``).

POINT: ``mid_upload`` (after the first new file is uploaded), ``before_manifest`` (every file
uploaded, manifest not yet rewritten), ``after_manifest`` (manifest rewritten, index not yet
updated), or ``none`` (no kill)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ckptstore.checkpointing import amend
from ckptstore.checkpointing import format as fmt
from ckptstore.storage_backends import open_storage


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillingStorage:
    """Delegates to a real Storage and kills the process at ``point``."""

    def __init__(self, storage: Any, point: str) -> None:
        self._storage = storage
        self._point = point

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def upload(self, local_dir: str, key: str, paths: Any = None, progress: Any = None) -> Any:
        if self._point == "mid_upload":
            files = sorted(fmt.local_files(local_dir))
            self._storage.upload(local_dir, key, paths=files[:1])
            die()
        return self._storage.upload(local_dir, key, paths=paths, progress=progress)

    def write_if_absent(self, key: str, data: bytes, **kw: Any) -> bool:
        created = self._storage.write_if_absent(key, data, **kw)
        if self._point == "mid_upload" and key.startswith(".ckptstore-blobs/"):
            die()  # a deduplicated checkpoint's new files go up as chunks
        return created

    def write_range_if_absent(self, key: str, *args: Any, **kw: Any) -> bool:
        created = self._storage.write_range_if_absent(key, *args, **kw)
        if self._point == "mid_upload" and key.startswith(".ckptstore-blobs/"):
            die()  # a chunk created from its range of a staged file
        return created

    def write_bytes(self, key: str, data: bytes) -> None:
        is_manifest = key.endswith("/" + fmt.MANIFEST_NAME)
        if is_manifest and self._point == "before_manifest":
            die()
        self._storage.write_bytes(key, data)
        if is_manifest and self._point == "after_manifest":
            die()

    def replace_if_unchanged(self, key: str, expected: bytes, data: bytes) -> bool:
        # The manifest rewrite is conditional on the bytes read (a fence against a late amend).
        is_manifest = key.endswith("/" + fmt.MANIFEST_NAME)
        if is_manifest and self._point == "before_manifest":
            die()
        replaced = self._storage.replace_if_unchanged(key, expected, data)
        if is_manifest and self._point == "after_manifest":
            die()
        return replaced


def main() -> None:
    url, uuid, src, point = sys.argv[1:5]
    index = None
    if len(sys.argv) > 5:
        from ckptstore.registry import Registry

        index = Registry(sys.argv[5])
    storage = open_storage(url)
    amend.add_files(KillingStorage(storage, point), uuid, src, index=index, storage_url=url)
    print("done", flush=True)


if __name__ == "__main__":
    main()
