"""Any other fsspec protocol (``sftp://``, ``hdfs://``, ``webdav://``, ...), through fsspec.

Used when no dedicated backend serves a URL scheme. ``write_if_absent`` uses the file system's
exclusive-create mode (``"xb"``) when it has one; otherwise it is check-then-write and NOT atomic
(a warning is logged once).

Example::

    from ckptstore.storage_backends import open_storage
    storage = open_storage("sftp://host/ckpts", username="me")
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any

import fsspec

from ckptstore import errors
from ckptstore.storage_backends.base import Storage
from ckptstore.storage_backends.config import COMMON_OPTIONS
from ckptstore.storage_backends.object_store import ObjectStorage

logger = logging.getLogger(__name__)


class FsspecStorage(ObjectStorage):
    """Storage on any installed fsspec implementation.

    Args:
        url: ``<protocol>://<path>``.
        **options: the common :class:`ObjectStorage` options; everything else is passed to
            ``fsspec.filesystem(protocol, **rest)`` (so it may hold credentials; it is never
            logged or shown in the repr).
    """

    remote = True

    def __init__(self, url: str, **options: Any) -> None:
        protocol = url.split("://", 1)[0].lower()
        common = {k: options.pop(k) for k in list(options) if k in COMMON_OPTIONS}
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as exc:
            if isinstance(exc, ImportError):
                raise errors.MissingDependency(
                    f"Storage protocol {protocol!r} needs a package that is not installed: {exc}"
                ) from None
            raise errors.InvalidStorageConfig(
                f"Unknown storage URL scheme {protocol!r}; use s3://, gs://, az://, file://, a "
                "plain path, memory://, or an installed fsspec protocol."
            ) from None
        self.scheme = protocol
        self.fs = cls(**options)
        self.root = cls._strip_protocol(url).rstrip("/")
        super().__init__(f"{protocol}://{self.root}", "", **common)
        self._warned = False

    def object_url(self, name: str) -> str:
        return f"{self.scheme}://{self._path(name)}"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def _list_objects(self, prefix: str) -> dict[str, int]:
        base = self._path(prefix.rstrip("/"))
        try:
            found = self.fs.find(base, detail=True, withdirs=True)
        except FileNotFoundError:
            return {}
        out: dict[str, int] = {}
        root = self.fs._strip_protocol(self.root).rstrip("/")
        dirs_with_children = set()
        for path in found:
            rel = path[len(root) + 1 :] if root else path.lstrip("/")
            parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
            dirs_with_children.add(parent)
        for path, info in found.items():
            rel = path[len(root) + 1 :] if root else path.lstrip("/")
            if not rel.startswith(prefix) or rel == prefix.rstrip("/"):
                continue
            if info.get("type") == "directory":
                if rel not in dirs_with_children:
                    out[rel + "/"] = 0
            else:
                out[rel] = int(info.get("size") or 0)
        return out

    def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent and parent != path:
            self.fs.makedirs(parent, exist_ok=True)

    def _upload_file(self, name: str, path: str, size: int) -> None:
        self._ensure_parent(self._path(name))
        self.fs.put_file(path, self._path(name))

    def _download_file(self, name: str, path: str, size: int) -> None:
        self.fs.get_file(self._path(name), path)

    def _read(self, name: str) -> bytes:
        return self.fs.cat_file(self._path(name))

    def _modified(self, name: str) -> float:
        info = self.fs.info(self._path(name))
        # Each fsspec implementation names the server's timestamp its own way.
        for field in ("LastModified", "last_modified", "updated", "mtime", "modified", "created"):
            value = info.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
            if isinstance(value, str):
                try:
                    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
        return Storage.modified_at(self, name)

    def _write(self, name: str, data: bytes) -> None:
        if name.endswith("/"):
            self.fs.makedirs(self._path(name.rstrip("/")), exist_ok=True)
            return
        self._ensure_parent(self._path(name))
        self.fs.pipe_file(self._path(name), data)

    def _write_if_absent(self, name: str, data: bytes) -> bool:
        path = self._path(name)
        self._ensure_parent(path)
        try:
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):
            pass
        if not self._warned:
            logger.warning(
                "%s has no exclusive create; write_if_absent is check-then-write (not atomic)",
                self.scheme,
            )
            self._warned = True
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def _delete_objects(self, names: list[str]) -> None:
        parents = set()
        for name in names:
            path = self._path(name.rstrip("/"))
            try:
                if name.endswith("/"):
                    self.fs.rmdir(path)
                else:
                    self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            parents.add(path.rsplit("/", 1)[0])
        # Folders this delete emptied disappear, as on an object store (no-op on those).
        for parent in sorted(parents, key=len, reverse=True):
            while parent.startswith(self.root + "/"):
                try:
                    if not self.fs.isdir(parent) or self.fs.ls(parent, detail=False):
                        break
                    self.fs.rmdir(parent)
                except (OSError, NotImplementedError):
                    break
                parent = parent.rsplit("/", 1)[0]

    def _is_object(self, name: str) -> bool:
        return self.fs.isfile(self._path(name))
