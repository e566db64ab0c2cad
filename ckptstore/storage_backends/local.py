"""Local or shared file-system storage (plain paths and ``file://`` URLs).

Files are written to a temporary sibling and renamed into place, so a reader never sees a
half-written file; :meth:`LocalStorage.write_if_absent` uses an ``O_EXCL``-style hard link;
:meth:`LocalStorage.rename_dir_into` moves a finished staging folder into place in one step.

Example::

    from ckptstore.storage_backends import open_storage
    storage = open_storage("/mnt/checkpoints")
    storage.write_bytes("exp1/note.txt", b"hello")
    print(storage.local_path("exp1/note.txt"))   # /mnt/checkpoints/exp1/note.txt
"""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

from ckptstore import errors
from ckptstore.storage_backends.object_store import TMP_MARK, ObjectStorage, pwrite_all, tmp_name
from ckptstore.storage_backends.paths import check_key, check_relpath, join_key

logger = logging.getLogger(__name__)


def local_root_from_url(url: str) -> str:
    """Absolute folder for a plain path or ``file://`` URL."""
    if url.startswith("file://"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise errors.InvalidStorageConfig(
                f"file:// URL {url!r} names host {parts.netloc!r}; use file:///absolute/path "
                "(three slashes) for a local folder."
            )
        path = unquote(parts.path)
    elif url.startswith("file:"):
        path = url[len("file:") :]
    else:
        path = url
    if not path:
        raise errors.InvalidStorageConfig(
            "An empty local path was given; pass a folder such as /mnt/checkpoints."
        )
    if "\x00" in path:
        raise errors.InvalidStorageConfig("A local storage path may not contain NUL bytes.")
    return os.path.abspath(os.path.expanduser(path))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_links_inside(path: str, home: str, root: str) -> str:
    """The real path of ``path`` (a file or folder under ``home``, itself under ``root``),
    or :class:`~ckptstore.errors.InvalidStoragePath` when a symbolic link takes it out of
    ``home``, or takes ``home`` out of ``root``. For a folder, every link below it is checked.

    ckptstore never writes links; one that leaves its checkpoint can only have been planted,
    and following it would serve any file the process can read (``/proc/self/environ``).
    """
    real_root = os.path.realpath(root)
    real_home = os.path.realpath(home)
    targets = [(path, os.path.realpath(path))]
    if os.path.isdir(path) and not os.path.islink(path):
        for folder, dirs, files in os.walk(path):
            targets += [
                (full, os.path.realpath(full))
                for full in (os.path.join(folder, n) for n in dirs + files)
                if os.path.islink(full)
            ]
    for shown, real in [(home, real_home), *targets]:
        boundary = real_root if shown == home else real_home
        if not _inside(real, boundary):
            raise errors.InvalidStoragePath(
                f"Refused to read {shown}: it is (or passes through) a symbolic link that "
                f"resolves outside {boundary}, which ckptstore never writes. Replace the link "
                f"with the file itself, or remove it. Received: a link to {real}"
            )
    return targets[0][1]


#: errno values of a hard link the file system refuses (another device, no links): copy instead.
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def copy_range(src_fd: int, dst_fd: int, count: int, src_offset: int, dst_offset: int) -> int:
    """Copy up to ``count`` bytes from ``src_fd`` at ``src_offset`` to ``dst_fd`` at
    ``dst_offset`` inside the kernel (``copy_file_range``: no copy through Python; a
    copy-on-write share where the file system offers it), with a read/write copy where the
    kernel or file system refuses. Returns the bytes copied: fewer than ``count`` only when
    the source ends first."""
    done = 0
    kernel = hasattr(os, "copy_file_range")
    while done < count:
        want = count - done
        if kernel:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, src_offset + done, dst_offset + done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                kernel = False
                continue
        else:
            data = os.pread(src_fd, min(want, 1 << 20), src_offset + done)
            n = pwrite_all(dst_fd, data, dst_offset + done)
        if n == 0:
            break
        done += n
    return done


class LocalStorage(ObjectStorage):
    """Storage in a local (or mounted shared) folder.

    Args:
        url: a plain path (``/mnt/ckpts``, ``~/ckpts``, ``./ckpts``) or ``file:///mnt/ckpts``.
            The folder is created on first write.
        **options: the common :class:`ObjectStorage` options (concurrency, ...).
    """

    scheme = "file"

    def __init__(self, url: str, **options: Any) -> None:
        self.root = local_root_from_url(url)
        super().__init__(f"file://{self.root}", "", **options)

    # ---- helpers ------------------------------------------------------------------------------
    def object_url(self, name: str) -> str:
        return f"file://{self._path(name)}"

    def _path(self, name: str) -> str:
        return os.path.join(self.root, *[p for p in name.split("/") if p])

    def _is_transient(self, exc: BaseException) -> bool:
        return False

    def local_path(self, key: str) -> str | None:
        return self._path(check_key(key))

    def rename_dir_into(self, local_dir: str, key: str) -> bool:
        target = self._path(check_key(key, allow_empty=False))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.rename(local_dir, target)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                logger.debug(
                    "cannot rename %s into %s (%s); caller uploads", local_dir, target, exc
                )
                return False
            raise self._translate(exc, key, False) from exc
        return True

    # ---- primitives ---------------------------------------------------------------------------
    def _list_objects(self, prefix: str) -> dict[str, int]:
        top = self._path(prefix)
        if not os.path.isdir(top):
            return {}
        out: dict[str, int] = {}
        for root, dirs, names in os.walk(top):
            rel_root = os.path.relpath(root, self.root).replace(os.sep, "/")
            rel_root = "" if rel_root == "." else rel_root
            files = [n for n in names if TMP_MARK not in n]
            for name in files:
                try:
                    out[join_key(rel_root, name)] = os.path.getsize(os.path.join(root, name))
                except FileNotFoundError:  # deleted while listing
                    continue
            if not dirs and not files and rel_root + "/" != prefix and root != top:
                out[rel_root + "/"] = 0
        return out

    def _upload_file(self, name: str, path: str, size: int) -> None:
        target = self._path(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = tmp_name(target)
        try:
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _download_file(self, name: str, path: str, size: int) -> None:
        with self._open_contained(name) as src, open(path, "wb") as dst:
            try:  # in the kernel, as shutil.copyfile does for two paths (3x copyfileobj)
                while os.sendfile(dst.fileno(), src.fileno(), None, 1 << 30):
                    pass
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                    raise
                src.seek(0)
                dst.seek(0)
                dst.truncate()
                shutil.copyfileobj(src, dst, 1 << 20)

    def _read(self, name: str) -> bytes:
        with self._open_file(name) as f:
            return f.read()

    def _open_file(self, name: str) -> io.BufferedReader:
        if os.path.isdir(self._path(name)):
            raise FileNotFoundError(self._path(name))
        return self._open_contained(name)

    def read_into(
        self,
        key: str,
        fd: int,
        offset: int,
        check: Callable[[bytes], None] | None = None,
    ) -> int:
        name = self._name(key)
        with self._call(lambda: self._open_file(name), name, "read") as f:
            if check is None:  # unchecked: no byte passes through Python
                size = os.fstat(f.fileno()).st_size
            else:
                data = f.read()  # the check (SHA-256) needs the bytes
                check(data)
                size = len(data)
            # The write is what costs (see write_range_if_absent): copied in the kernel from
            # the file just checked. A file changed in between is caught by the reader's
            # whole-file crc32c, as any later damage would be.
            if copy_range(f.fileno(), fd, size, 0, offset) != size:
                raise errors.ChecksumMismatch(
                    f"{self.object_url(name)} shrank while it was read; it was modified outside "
                    "ckptstore. Run `ckptstore storage validate` on this storage."
                )
        return size

    def _open_contained(self, name: str) -> io.BufferedReader:
        """Object ``name`` opened for reading, after :func:`check_links_inside` accepted its
        real path: a symbolic link out of the folder it belongs to is refused."""
        parts = [p for p in name.split("/") if p]
        # The folder an object belongs to: its checkpoint (``<uuid>/``), ``logs/``,
        # ``blobs/``...; the root itself for a top-level object.
        home = self._path(parts[0]) if len(parts) > 1 else self.root
        real = check_links_inside(self._path(name), home, self.root)
        # The checked path, with no link left to follow in its last part (a link swapped in
        # after the check fails here instead of being followed).
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        return os.fdopen(fd, "rb")

    def _write(self, name: str, data: bytes) -> None:
        target = self._path(name)
        if name.endswith("/"):
            os.makedirs(target, exist_ok=True)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = tmp_name(target)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    _fsyncs = True

    def _write_if_absent(self, name: str, data: bytes, sync: bool = True) -> bool:  # type: ignore[override]
        return self._link_new(name, lambda f: f.write(data), sync)

    def _link_new(self, name: str, fill: Callable[[io.BufferedWriter], object], sync: bool) -> bool:
        """Create ``name`` only if absent: ``fill`` writes a temporary sibling, which is then
        hard-linked into place (atomic create-only: complete content or nothing)."""
        target = self._path(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = tmp_name(target)
        try:
            with open(tmp, "xb") as f:
                fill(f)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_range_if_absent(
        self, key: str, path: str, offset: int, length: int, *, durable: bool = True
    ) -> bool:
        # Copied in the kernel (copy_file_range): no Python buffer per chunk, and on file
        # systems with reflinks (XFS, btrfs) the chunk shares the staged file's blocks instead
        # of being copied. On ext4 it measured the same as pread + write (0.14-0.15 s for 384
        # MiB, page cache flushed between runs).
        name = join_key(self.prefix, check_relpath(key))
        if os.path.getsize(path) < offset + length:
            raise errors.CheckpointError(
                f"{path} changed while it was being stored: shorter than offset {offset} + "
                f"{length} bytes. Do not modify a checkpoint folder being saved."
            )
        return bool(
            self._call(
                lambda: self._copy_if_absent(name, path, offset, length, durable), name, "write"
            )
        )

    def link_if_absent(self, key: str, path: str, *, durable: bool = True) -> bool:
        # A hard link is atomic and create-only, and writes no data: the chunk's bytes stay
        # where the writer put them (its staging folder on this file system). durable: they
        # are synced before the link, as a copied chunk would be.
        name = join_key(self.prefix, check_relpath(key))
        target = self._path(name)

        def link() -> bool | None:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if durable:
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            try:
                os.link(path, target)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise
                return None
            return True

        linked = self._call(link, name, "write")
        if linked is not None:
            return bool(linked)
        logger.debug("cannot link %s into %s; copying it", path, target)
        return super().link_if_absent(key, path, durable=durable)

    def _copy_if_absent(self, name: str, path: str, offset: int, length: int, sync: bool) -> bool:
        def fill(dst: io.BufferedWriter) -> None:
            with open(path, "rb") as src:
                if copy_range(src.fileno(), dst.fileno(), length, offset, 0) != length:
                    raise OSError(errno.EIO, f"{path} shrank while it was being stored")

        return self._link_new(name, fill, sync)

    def _delete_objects(self, names: list[str]) -> None:
        parents = set()
        for name in names:
            path = self._path(name)
            try:
                if name.endswith("/"):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            parents.add(os.path.dirname(path.rstrip(os.sep)))
        # Folders emptied by this delete disappear, as they would on an object store.
        for parent in sorted(parents, key=len, reverse=True):
            self._prune(parent)

    def _prune(self, folder: str) -> None:
        while folder.startswith(self.root + os.sep):
            try:
                os.rmdir(folder)
            except OSError:
                return
            folder = os.path.dirname(folder)

    def _is_object(self, name: str) -> bool:
        return os.path.isfile(self._path(name))

    def _modified(self, name: str) -> float:
        # The file system's clock (on NFS, the server's): the same one for every writer.
        return os.stat(self._path(name)).st_mtime

    def _replace_if_match(self, name: str, expected: bytes, data: bytes) -> bool:
        # Every conditional replace of one file takes an exclusive lock on the file it read
        # and checks the path still names it (a replace since the open makes it stale), so two
        # of them (an amend, GC's tombstone) never both win. NFS maps flock to its own locks.
        target = self._path(name)
        try:
            fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return False
        try:
            _lock_briefly(fd, target)
            try:
                if os.stat(target, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                    return False
            except FileNotFoundError:
                return False
            with os.fdopen(os.dup(fd), "rb") as f:
                if f.read() != expected:
                    return False
            tmp = tmp_name(target)
            try:
                with open(tmp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return True
        finally:
            os.close(fd)

    # ---- overrides ----------------------------------------------------------------------------
    def delete(self, key: str, globs: Iterable[str] | None = None) -> dict[str, int]:
        if globs is not None:
            return super().delete(key, globs)
        path = self._path(check_key(key))
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                if path == self.root:
                    for child in os.listdir(path):
                        full = os.path.join(path, child)
                        if os.path.isdir(full) and not os.path.islink(full):
                            shutil.rmtree(full)
                        else:
                            os.unlink(full)
                else:
                    shutil.rmtree(path)
                    self._prune(os.path.dirname(path))
            elif os.path.lexists(path):
                os.unlink(path)
                self._prune(os.path.dirname(path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._translate(exc, check_key(key), False) from exc
        return {}


#: How long a conditional replace waits for another one's lock on the same file (held for
#: one small write; a holder stopped longer than this makes the caller's step fail, not wait).
LOCK_WAIT_SECONDS = 10.0


def _lock_briefly(fd: int, path: str) -> None:
    import fcntl
    import time

    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise errors.StorageUnavailable(
                    f"{path} stayed locked by another ckptstore process for over "
                    f"{LOCK_WAIT_SECONDS:.0f} s (a paused amend or GC); nothing was changed. "
                    "Run the command again."
                ) from None
            time.sleep(0.05)
