"""In-process storage for tests and demos (``memory://name/prefix``).

Objects live in one process-wide dict, so two ``open_storage("memory://x")`` calls see the same
data (like fsspec's ``memory://``). Nothing survives the process.

Example::

    from ckptstore.storage_backends import open_storage
    storage = open_storage("memory://scratch/run1")
    assert storage.write_if_absent("lock", b"1") is True
    assert storage.write_if_absent("lock", b"2") is False
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ckptstore.storage_backends.object_store import ObjectStorage

_LOCK = threading.Lock()
_OBJECTS: dict[str, bytes] = {}
#: When each object was written (this process is the storage, so its clock is the storage's).
_STAMPS: dict[str, float] = {}


class MemoryStorage(ObjectStorage):
    """Storage in a process-wide dict; ``memory://a/b`` and ``memory://a`` share objects.

    Args:
        url: ``memory://`` URL; everything after ``memory://`` is the prefix.
        **options: the common :class:`ObjectStorage` options (concurrency, ...).
    """

    scheme = "memory"

    def __init__(self, url: str, **options: Any) -> None:
        path = url.split("://", 1)[-1].strip("/")
        super().__init__(f"memory://{path}", path, **options)

    def _bucket_label(self) -> str:
        return ""

    def object_url(self, name: str) -> str:
        return f"memory://{name}"

    def _list_objects(self, prefix: str) -> dict[str, int]:
        with _LOCK:
            return {k: len(v) for k, v in _OBJECTS.items() if k.startswith(prefix)}

    def _upload_file(self, name: str, path: str, size: int) -> None:
        with open(path, "rb") as f:
            data = f.read()
        with _LOCK:
            _OBJECTS[name] = data
            _STAMPS[name] = time.time()

    def _download_file(self, name: str, path: str, size: int) -> None:
        data = self._read(name)
        with open(path, "wb") as f:
            f.write(data)

    def _read(self, name: str) -> bytes:
        with _LOCK:
            if name not in _OBJECTS:
                raise FileNotFoundError(name)
            return _OBJECTS[name]

    def _write(self, name: str, data: bytes) -> None:
        with _LOCK:
            _OBJECTS[name] = data
            _STAMPS[name] = time.time()

    def _write_if_absent(self, name: str, data: bytes) -> bool:
        with _LOCK:
            if name in _OBJECTS:
                return False
            _OBJECTS[name] = data
            _STAMPS[name] = time.time()
            return True

    def _replace_if_match(self, name: str, expected: bytes, data: bytes) -> bool:
        with _LOCK:
            if _OBJECTS.get(name) != expected:
                return False
            _OBJECTS[name] = data
            _STAMPS[name] = time.time()
            return True

    def _delete_objects(self, names: list[str]) -> None:
        with _LOCK:
            for name in names:
                _OBJECTS.pop(name, None)
                _STAMPS.pop(name, None)

    def _is_object(self, name: str) -> bool:
        with _LOCK:
            return name in _OBJECTS

    def _modified(self, name: str) -> float:
        with _LOCK:
            if name not in _OBJECTS:
                raise FileNotFoundError(name)
            return _STAMPS.get(name, 0.0)
