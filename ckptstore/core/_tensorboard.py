"""Copying a local TensorBoard log folder to ``<storage>/tensorboard/<trial id>/``, new or
changed files only. One owner for ``train.upload_tensorboard_files()`` and the Keras
``TensorBoard`` callback.

Example::

    sync = TensorboardSync(storage, "/tmp/tb", trial_id=3)
    sync.upload()   # ["events.out.tfevents..."]
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptstore.defaults import TENSORBOARD_PREFIX

if TYPE_CHECKING:
    from ckptstore.storage_backends import Storage

logger = logging.getLogger(__name__)


def tensorboard_key(trial_id: int | None) -> str:
    """The storage key TensorBoard logs of ``trial_id`` go under."""
    return f"{TENSORBOARD_PREFIX}/{trial_id if trial_id is not None else 'none'}"


class TensorboardSync:
    """Uploads files of ``log_dir`` that are new or changed (size or mtime) since the last call."""

    def __init__(self, storage: Storage, log_dir: str | os.PathLike[str], trial_id: int | None):
        self.storage = storage
        self.log_dir = os.fspath(log_dir)
        self.key = tensorboard_key(trial_id)
        self._uploaded: dict[str, tuple[int, int]] = {}

    def upload(self, selector: Callable[[pathlib.Path], bool] | None = None) -> list[str]:
        """Upload new or changed files (those ``selector`` accepts); returns their relative
        paths."""
        changed: list[str] = []
        stats: dict[str, tuple[int, int]] = {}
        for root, _dirs, files in os.walk(self.log_dir):
            for name in files:
                full = os.path.join(root, name)
                if selector is not None and not selector(pathlib.Path(full)):
                    continue
                rel = os.path.relpath(full, self.log_dir).replace(os.sep, "/")
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # a writer rotated it away meanwhile
                    continue
                stats[rel] = (st.st_size, st.st_mtime_ns)
                if self._uploaded.get(rel) != stats[rel]:
                    changed.append(rel)
        if changed:
            self.storage.upload(self.log_dir, self.key, paths=changed)
            for rel in changed:
                self._uploaded[rel] = stats[rel]
            logger.debug("Synced %d TensorBoard files to %s", len(changed), self.key)
        return changed


__all__ = ["TENSORBOARD_PREFIX", "TensorboardSync", "tensorboard_key"]
