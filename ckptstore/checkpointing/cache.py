"""The local restore cache: verified files of checkpoints already loaded on this machine, so
loading a checkpoint again, or the next one of the same trial, fetches only what this machine
does not hold yet (for deduplicated checkpoints, the chunks it does not hold).

Layout, under ``<CKPTSTORE_HOME>/cache/`` (``CKPTSTORE_CACHE_DIR`` moves it)::

    files/<key[:2]>/<key>   one verified file of a checkpoint, whole
    index.db                SQLite: each entry's size and last use; for a deduplicated
                            (format-2) file, where each of its chunks lies in it; recent loads

A format-2 file is keyed by its list of chunks (SHA-256 of the chunks' SHA-256 and sizes, so
by its content: checkpoints and storages share it); a whole (format-1) file by (storage URL,
uuid, path, size, crc32c). A load takes a file it needs whole from the cache when it can (a
hard link and one CRC-32C pass: loading the same checkpoint again), else the chunks it needs
from any cached file holding them (the next checkpoint of a trial: only changed chunks come
from storage), and keeps each file it assembled or downloaded (a hard link, no copy).

Choices made where the issue is silent:

- **Never trusted blindly.** A chunk read from a cached file is used only if its bytes hash to
  its SHA-256; a file taken whole only if it is unchanged since insertion (its identity:
  device, inode, size, mtime, ctime as last seen, else its SHA-256 recorded at insertion) and
  its size and CRC-32C match the manifest (CRC-32C alone is affine: an edit can keep it).
  The folder is private (0700, owner checked); entries are read-only. A damaged entry (a disk error, or a hard-linked copy the
  user edited in place, see below) is dropped and fetched again.
- **Files, not chunks.** Chunks as separate entries (tried first) cost a copy of every byte
  into the cache on a first load (1.2x a plain download on moto) and a copy out of it plus a
  SHA-256 pass on every reload (0.26-0.82x a plain download); keeping the files costs neither
  (links) and still serves every chunk.
- **Whole files are keyed by where they come from, not by their crc32c alone.** CRC-32C has 32
  bits: two different ``model.keras`` of the same size collide with probability ~n²/2³³
  (1% at ~9,000 same-size files), and a collision would pass verification. A committed
  checkpoint's files never change, so (storage, uuid, path, size, crc32c) names one content.
  Format-2 files are keyed by their SHA-256 chunk list instead, so they are shared.
- **Hard links.** A download into a folder hard-links whole files from the cache (a copy when
  the folder is on another file system), and a file fetched from storage is linked into the
  cache. A user who then edits that file *in place* edits the cache entry too: the next
  read sees the crc32c differ, drops the entry and fetches the file again, so correctness
  never depends on the user leaving the file alone (only the saving does).
- **Several processes at once.** Entries are written to a temporary name in their folder and
  renamed into place (never a torn file under an entry's name; two processes writing the same
  entry write the same bytes). The index is SQLite (WAL, one short write transaction per
  load), not file mtimes: the size of the cache is a ``SUM`` instead of a walk of every file,
  and eviction and the recording of a load are serialized by SQLite's write lock, so an entry
  is counted once (``INSERT .. ON CONFLICT``) and a row is (re)written only for a file that
  exists at that moment. A crash can leave a file without a row (adopted by its next use) or a
  row without a file (a miss, then rewritten): the cache heals itself; ``ckptstore cache
  clear`` starts over.
- **Size.** ``CKPTSTORE_CACHE_SIZE`` (``"20GB"``, ``"512MiB"``, a number of bytes) or the
  ``limit`` option; by default 10% of the free space of the cache's file system (counting the
  cache itself as free), recomputed at each load. After each load the least recently used
  entries are deleted until the cache is within its limit; an entry larger than the limit is
  not kept. The size counts every byte the cache names, also when a file is hard-linked into
  one of your folders (then the disk holds it once).
- **When.** On by default for remote storage (``Storage.remote``: S3, GCS, Azure); a local or
  shared-file-system storage is read in place or from the same disk, where a cache would only
  double the bytes on disk. ``cache=True`` or ``CKPTSTORE_CACHE=on`` turns it on for every
  storage (e.g. a slow network file system), ``cache=False`` or ``CKPTSTORE_CACHE=off`` off.
  The cache is local: storage GC never looks at it, and it never changes what GC does.

Example::

    from ckptstore.checkpointing.cache import RestoreCache

    cache = RestoreCache(limit="2GB")
    print(cache.info())            # CacheInfo(root=..., size=..., entries=..., hit_rate=...)
    cache.clear()
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import mmap
import os
import re
import shutil
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ckptstore import defaults, errors
from ckptstore.checkpointing.checksums import crc32c_update, file_sums
from ckptstore.checkpointing.entries import Chunk
from ckptstore.storage_backends.object_store import TMP_MARK, tmp_name

if TYPE_CHECKING:
    from ckptstore.checkpointing.entries import FileEntry
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

CACHE_ENV = "CKPTSTORE_CACHE"
SIZE_ENV = "CKPTSTORE_CACHE_SIZE"
DIR_ENV = "CKPTSTORE_CACHE_DIR"
#: Default limit: this fraction of the free space of the cache's file system (plus its own
#: size). A tenth leaves a shared machine's disk to its users while holding the few
#: checkpoints a job moves between (one Keras checkpoint is usually far below 10% of a disk).
DEFAULT_FRACTION = 0.10
#: Loads kept for the hit rate ``cache info`` shows.
RECENT_LOADS = 100
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
_INDEX = "index.db"
#: The content record of an entry checked by its chunks' SHA-256 (:meth:`RestoreCache._intact`).
BY_CHUNKS = "chunks"
_OFF = {"off", "0", "false", "no"}
_ON = {"on", "1", "true", "yes"}


def parse_size(text: str | int, *, name: str = SIZE_ENV) -> int:
    """Bytes in ``text``: an int, ``"20GB"`` (10^9), ``"512MiB"`` (2^20), ``"1.5T"``."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise errors.InvalidConfig(
            f"{name} must be a size such as '20GB', '512MiB' or a number of bytes. "
            f"Received: {text!r}"
        )
    number, unit, binary = match.groups()
    scale = 1024 ** "_kmgt".index(unit.lower()) if binary and unit else _UNITS[unit.lower()]
    return int(float(number) * scale)


def env_choice() -> bool | None:
    """``CKPTSTORE_CACHE``: ``off`` -> False, ``on`` -> True (also for local storage), unset
    or ``auto`` -> None (on for remote storage); an unknown value is refused."""
    value = os.environ.get(CACHE_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    if value in ("", "auto"):
        return None
    raise errors.InvalidConfig(
        f"{CACHE_ENV} must be 'on', 'off' or 'auto' (the restore cache; auto = on for remote "
        f"storage). Received: {os.environ[CACHE_ENV]!r}"
    )


def _key_of(name: str) -> str:
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return f"files/{digest[:2]}/{digest}"


def default_root() -> Path:
    """``CKPTSTORE_CACHE_DIR``, else ``<CKPTSTORE_HOME>/cache``."""
    return Path(os.environ.get(DIR_ENV) or defaults.home() / "cache").expanduser()


@dataclass(frozen=True)
class CacheInfo:
    """What ``ckptstore cache info`` shows: ``hit_rate`` is the share of the bytes of the last
    :data:`RECENT_LOADS` loads that came from the cache (None before any load)."""

    root: str
    size: int
    entries: int
    limit: int
    loads: int
    hit_rate: float | None


@dataclass
class LoadStats:
    """Bytes one load took from storage and from the cache, the entries it used or added
    and where the chunks of the format-2 files it added lie in them
    (thread-safe: chunks are fetched on several threads)."""

    from_storage: int = 0
    from_cache: int = 0
    used: set[str] = field(default_factory=set)
    layouts: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, size: int, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self.from_cache += size
            else:
                self.from_storage += size

    def use(self, key: str, chunks: Sequence[Chunk] = ()) -> None:
        """Entry ``key`` was used or added (``chunks``: its chunk list, for a format-2 file)."""
        with self._lock:
            self.used.add(key)
            if chunks:
                starts = itertools.accumulate((c.size for c in chunks), initial=0)
                self.layouts[key] = [(c.sha256, o) for c, o in zip(chunks, starts, strict=False)]


class RestoreCache:
    """The cache of verified chunks and whole files under ``root`` (module docstring).

    Args:
        root: the folder (default :func:`default_root`).
        limit: the most bytes kept: an int or a size string (default ``CKPTSTORE_CACHE_SIZE``,
            else :data:`DEFAULT_FRACTION` of the free disk).

    Example::

        ctx = CheckpointContext("s3://bucket/ckpts", cache=RestoreCache(limit="20GB"))
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, limit: int | str | None = None):
        self.root = Path(root).expanduser() if root is not None else default_root()
        if limit is None and os.environ.get(SIZE_ENV):
            self._limit: int | None = parse_size(os.environ[SIZE_ENV], name=SIZE_ENV)
        else:
            self._limit = None if limit is None else parse_size(limit, name="limit")

    def __repr__(self) -> str:
        return f"RestoreCache(root={str(self.root)!r}, limit={self._limit!r})"

    # ---- entries -------------------------------------------------------------------------------
    @staticmethod
    def content_key(chunks: Sequence[Chunk]) -> str:
        """The key of a format-2 file: its chunks' SHA-256 and sizes (its content)."""
        listed = "".join(f"{c.sha256}:{c.size}," for c in chunks)
        return _key_of(f"chunks\0{listed}")

    @staticmethod
    def file_key(storage_url: str, uuid: str, rel: str, entry: FileEntry) -> str:
        """The key of a whole (format-1) file: where it comes from, its size and crc32c."""
        return _key_of("\0".join([storage_url, uuid, rel, str(entry.size), entry.crc32c]))

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def link_file(
        self, key: str, target: str, entry: FileEntry, *, sha256: bool = False
    ) -> str | None:
        """Put the cached file ``key`` at ``target`` (hard link, else copy) if it matches
        ``entry``'s size and crc32c; a damaged entry is dropped. Returns None if it was not
        placed, else its SHA-256 (``sha256=True``: from the read that checks the crc32c; no
        digest is kept in the cache, so none can go stale) or ``""``."""
        path = self._path(key)
        part = tmp_name(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        recorded = self._recorded(key)
        before = _ident_of(path)
        try:
            _link_or_copy(path, part)
        except FileNotFoundError:
            return None
        # CRC-32C is affine (16 bytes of arithmetic keep it through an edit), so a hit is
        # served only if the file is unchanged since insertion: its identity (device, inode,
        # size, mtime, ctime) as last seen, else its SHA-256 as recorded. Checked on the link,
        # not the entry's name: an eviction meanwhile cannot swap it.
        same = recorded is not None and recorded[0] == before and _same_inode(before, part)
        if recorded is not None and os.path.getsize(part) == entry.size:
            by_sha = not same and recorded[1] != BY_CHUNKS
            crc, sha = file_sums(part, sha256=sha256 or by_sha)
            if crc == entry.crc32c and (same or self._intact(key, recorded[1], sha, part)):
                os.replace(part, target)
                self._seen(key, _ident_of(path))  # our own link changed its ctime
                return sha or ""
        os.unlink(part)
        self.drop(key)
        return None

    def open_entry(self, key: str, entry: FileEntry) -> int | None:
        """An open read-only descriptor of cached file ``key``, for a caller that reads it in
        place (no link, so its identity stays as recorded), if it passes :meth:`link_file`'s
        checks: unchanged since insertion (else its recorded SHA-256), then ``entry``'s size
        and crc32c, all read through the descriptor. A damaged entry is dropped; None: not
        served. The descriptor keeps the bytes readable if the entry is evicted meanwhile;
        the caller closes it."""
        recorded = self._recorded(key)
        if recorded is None:
            return None
        try:
            fd = os.open(self._path(key), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            same = _ident(info) == recorded[0]
            if info.st_size == entry.size:
                by_sha = not same and recorded[1] != BY_CHUNKS
                crc, sha = fd_sums(fd, info.st_size, sha256=by_sha)
                if crc == entry.crc32c and (same or self._intact(key, recorded[1], sha, fd)):
                    if not same:
                        self._seen(key, _ident(info))
                    fd, served = -1, fd
                    return served
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)
        self.drop(key)
        return None

    def _intact(self, key: str, recorded: str, sha: str | None, file: int | str) -> bool:
        """Whether entry ``key``, whose identity changed since it was last seen, still holds
        what it held at insertion: its whole-file SHA-256 as ``recorded``, or for a
        deduplicated file's entry recorded :data:`BY_CHUNKS`, every chunk's SHA-256 at its
        offset (the chunks table; they must make up the list its key names)."""
        if recorded != BY_CHUNKS:
            return sha == recorded
        with self._db() as db:
            rows = db.execute(
                "SELECT sha, offset FROM chunks WHERE key = ? ORDER BY offset", (key,)
            ).fetchall()
        if not rows or rows[0][1] != 0:
            return False
        fd = os.open(file, os.O_RDONLY) if isinstance(file, str) else file
        try:
            size = os.fstat(fd).st_size
            ends = [offset for _sha, offset in rows[1:]] + [size]
            chunks = [Chunk(c, end - at) for (c, at), end in zip(rows, ends, strict=True)]
            if self.content_key(chunks) != key or not size:
                return False
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    return all(
                        hashlib.sha256(view[at : at + c.size]).hexdigest() == c.sha256
                        for c, (_sha, at) in zip(chunks, rows, strict=True)
                    )
                finally:
                    view.release()
        finally:
            if isinstance(file, str):
                os.close(fd)

    def _recorded(self, key: str) -> tuple[str | None, str] | None:
        """(identity as last seen, SHA-256 at insertion) of entry ``key``; None: unknown
        (an orphan, or an index from before: never served whole)."""
        if not (self.root / _INDEX).exists():
            return None
        with self._db() as db:
            row = db.execute("SELECT ident, sha FROM entries WHERE key = ?", (key,)).fetchone()
        return (row[0], row[1]) if row and row[1] else None

    def _seen(self, key: str, ident: str | None) -> None:
        with self._db() as db:
            db.execute("UPDATE entries SET ident = ? WHERE key = ?", (ident, key))

    def chunk_places(self, shas: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
        """``{sha256: [(key, offset), ...]}``: the cached files holding each chunk (one query
        per 500 chunks; a place may be gone by the time it is read: then it is a miss)."""
        wanted = sorted(set(shas))
        places: dict[str, list[tuple[str, int]]] = {}
        if not wanted or not (self.root / _INDEX).exists():
            return places
        with self._db() as db:
            for i in range(0, len(wanted), 500):
                part = wanted[i : i + 500]
                marks = ",".join("?" * len(part))
                for sha, key, offset in db.execute(
                    f"SELECT sha, key, offset FROM chunks WHERE sha IN ({marks})", part
                ):
                    places.setdefault(sha, []).append((key, offset))
        return places

    def read_chunk(
        self, sha256: str, size: int, places: Sequence[tuple[str, int]]
    ) -> tuple[str, bytes] | None:
        """``(key, bytes)`` of the chunk from the first cached file holding it intact; a file
        whose bytes there do not hash to ``sha256`` is dropped. None if none holds it."""
        for key, offset in places:
            try:
                with open(self._path(key), "rb") as f:
                    data = os.pread(f.fileno(), size, offset)
            except OSError:
                continue
            if len(data) == size and hashlib.sha256(data).hexdigest() == sha256:
                return key, data
            self.drop(key)
        return None

    def put_file(self, key: str, source: str, *, move: bool = False) -> None:
        """Keep the file at ``source`` as entry ``key`` (hard link, else copy; renamed into
        place; ``move``: ``source`` is then removed, so the entry's identity recorded by this
        load stays its identity). Best effort: a full disk or a read-only cache costs the
        saving, never the load (a file not kept is left at ``source``)."""
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part = tmp_name(path)
            _link_or_copy(source, part)
            if move:
                os.unlink(source)
            # Read-only: a link to it in a user's folder cannot be written by accident (an
            # edit anyway changes its identity, and the entry is then a miss).
            os.chmod(part, 0o444)
            os.replace(part, path)
        except OSError as exc:
            logger.warning("Restore cache %s: could not keep %s (%s)", self.root, key, exc)

    def drop(self, key: str) -> None:
        """Delete a damaged entry (file and rows) so the load fetches it again."""
        logger.warning(
            "Restore cache %s: entry %s is damaged; dropped, fetching it again", self.root, key
        )
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
            db.execute("DELETE FROM entries WHERE key = ?", (key,))
            db.execute("DELETE FROM chunks WHERE key = ?", (key,))
            db.execute("COMMIT")

    # ---- the index -----------------------------------------------------------------------------
    def _private_root(self) -> None:
        """Create the cache folder private to this user (0700) or check that it is: cached
        weights are other users' to read, and a folder another user made could serve them
        anything. :class:`~ckptstore.errors.InvalidConfig` otherwise."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        info = os.lstat(self.root)
        if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
            raise errors.InvalidConfig(
                f"The restore cache folder {self.root} is not a folder of yours (owner uid "
                f"{info.st_uid}, yours {os.getuid()}; a link is refused too): not used. Set "
                f"{DIR_ENV} to a folder of your own. Received: {str(self.root)!r}"
            )
        if info.st_mode & 0o077:  # ours, made with a looser umask: made private
            os.chmod(self.root, 0o700)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self._private_root()
        db = sqlite3.connect(self.root / _INDEX, timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # A cache: a crash may lose the last loads' rows (the files heal it), not a fsync
            # per load.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS entries"
                " (key TEXT PRIMARY KEY, size INTEGER NOT NULL, used REAL NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS chunks (sha TEXT NOT NULL, key TEXT NOT NULL,"
                " offset INTEGER NOT NULL, PRIMARY KEY (sha, key))"
            )
            db.execute("CREATE INDEX IF NOT EXISTS chunks_key ON chunks (key)")
            columns = [row[1] for row in db.execute("PRAGMA table_info(entries)")]
            for column in ("ident", "sha"):  # an index from before they were recorded
                if column not in columns:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process did
                        db.execute(f"ALTER TABLE entries ADD COLUMN {column} TEXT")
            db.execute(
                "CREATE TABLE IF NOT EXISTS loads (id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " at REAL NOT NULL, from_storage INTEGER NOT NULL, from_cache INTEGER NOT NULL)"
            )
            yield db
        finally:
            db.close()

    def limit(self, cached: int = 0) -> int:
        """The limit in bytes (``cached``: the cache's own size, counted as free space)."""
        if self._limit is not None:
            return self._limit
        self._private_root()
        return int((shutil.disk_usage(self.root).free + cached) * DEFAULT_FRACTION)

    def record(self, stats: LoadStats) -> None:
        """Record one load: its entries become the most recently used (a row only for a file
        that exists now), the load joins the hit rate, and least recently used entries are
        evicted until the cache fits its limit. One write transaction, so concurrent loads
        and evictions are serialized and nothing is counted twice."""
        now = time.time()
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for key in sorted(stats.used):
                    try:  # the file is the truth: no row for a file gone meanwhile
                        size = os.path.getsize(self._path(key))
                    except OSError:
                        continue
                    if db.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone():
                        db.execute(
                            "UPDATE entries SET used = ?, size = ? WHERE key = ?", (now, size, key)
                        )
                    else:  # inserted now: its identity and content (what later hits must match)
                        ident = _ident_of(self._path(key))
                        sha = _content_record(self._path(key), stats.layouts.get(key))
                        db.execute(
                            "INSERT INTO entries (key, size, used, ident, sha) VALUES (?, ?, ?, ?, ?)",
                            (key, size, now, ident, sha),
                        )
                    db.executemany(
                        "INSERT OR IGNORE INTO chunks VALUES (?, ?, ?)",
                        [(sha, key, off) for sha, off in stats.layouts.get(key, ())],
                    )
                db.execute(
                    "INSERT INTO loads (at, from_storage, from_cache) VALUES (?, ?, ?)",
                    (now, stats.from_storage, stats.from_cache),
                )
                db.execute(
                    "DELETE FROM loads WHERE id <= (SELECT MAX(id) FROM loads) - ?",
                    (RECENT_LOADS,),
                )
                self._evict(db)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _adopt_orphans(self, db: sqlite3.Connection) -> None:
        """Count the files a crash left without a row (written before the load recorded them)
        as least recently used entries, so eviction sees them; remove temporary files a
        killed load left. Younger than a minute: a load running now is about to record it."""
        known = {row[0] for row in db.execute("SELECT key FROM entries")}
        cutoff = time.time() - 60
        for folder, _dirs, names in os.walk(self.root / "files"):
            for name in names:
                path = os.path.join(folder, name)
                key = os.path.relpath(path, self.root).replace(os.sep, "/")
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue
                if key in known or info.st_mtime > cutoff:
                    continue
                if TMP_MARK in name or not stat.S_ISREG(info.st_mode):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    continue
                db.execute(
                    "INSERT OR IGNORE INTO entries (key, size, used, ident) VALUES (?, ?, ?, ?)",
                    (key, info.st_size, 0.0, None),  # no identity: never served whole
                )

    def _evict(self, db: sqlite3.Connection) -> None:
        self._adopt_orphans(db)
        total = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
        limit = self.limit(total)
        if total <= limit:
            return
        rows = db.execute("SELECT key, size FROM entries ORDER BY used, key").fetchall()
        for key, size in rows:
            if total <= limit:
                break
            # Unlinked inside the transaction: a load recording this key after the commit
            # sees no file and writes no row.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
            db.execute("DELETE FROM entries WHERE key = ?", (key,))
            db.execute("DELETE FROM chunks WHERE key = ?", (key,))
            total -= size
        logger.debug(
            "Restore cache %s: evicted down to %d bytes (limit %d)", self.root, total, limit
        )

    def info(self) -> CacheInfo:
        """Size, entries, limit and hit rate of the recent loads."""
        with self._db() as db:
            size, entries = db.execute(
                "SELECT COALESCE(SUM(size), 0), COUNT(*) FROM entries"
            ).fetchone()
            loads, storage, cached = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(from_storage), 0), COALESCE(SUM(from_cache), 0)"
                " FROM loads"
            ).fetchone()
        rate = cached / (storage + cached) if storage + cached else None
        return CacheInfo(str(self.root), size, entries, self.limit(size), loads, rate)

    def clear(self) -> int:
        """Delete every entry and the load history; returns the bytes freed (as indexed)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            size = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
            shutil.rmtree(self.root / "files", ignore_errors=True)
            db.execute("DELETE FROM entries")
            db.execute("DELETE FROM chunks")
            db.execute("DELETE FROM loads")
            db.execute("COMMIT")
        return int(size)


def _content_record(path: str, layout: Sequence[tuple[str, int]] | None) -> str | None:
    """What an entry's content is checked by when its identity changes: :data:`BY_CHUNKS`
    for a deduplicated file whose chunks are all distinct (each verified as it was fetched:
    no pass over the file now), else its whole-file SHA-256."""
    if layout and len({sha for sha, _offset in layout}) == len(layout):
        return BY_CHUNKS
    return file_sums(path, sha256=True)[1]


def _ident_of(path: str) -> str | None:
    """A file's identity: device, inode, size, mtime and ctime (ns); None if it is gone."""
    try:
        return _ident(os.stat(path))
    except OSError:
        return None


def _ident(s: os.stat_result) -> str:
    return f"{s.st_dev}:{s.st_ino}:{s.st_size}:{s.st_mtime_ns}:{s.st_ctime_ns}"


def fd_sums(fd: int, size: int, *, sha256: bool = False) -> tuple[str, str | None]:
    """``(crc32c, sha256 or None)`` of the ``size`` bytes of open file ``fd``, mapped (no copy
    out of the page cache)."""
    if size == 0:
        return "00000000", hashlib.sha256().hexdigest() if sha256 else None
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        crc = crc32c_update(0, mapped)
        digest = hashlib.sha256(mapped).hexdigest() if sha256 else None
    return f"{crc:08x}", digest


def _same_inode(ident: str | None, path: str) -> bool:
    """Whether ``path`` is the file whose identity is ``ident`` (a link to it, not a copy)."""
    try:
        s = os.stat(path)
    except OSError:
        return False
    return ident is not None and ident.split(":")[:2] == [str(s.st_dev), str(s.st_ino)]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except FileNotFoundError:
        raise
    except OSError:  # another file system, or links not supported: a copy
        shutil.copyfile(source, target)


CacheOption = bool | RestoreCache | None


def resolve(cache: CacheOption, storage: Storage) -> RestoreCache | None:
    """The cache a load uses: ``cache`` itself, none for ``False``, the default cache for
    ``True``; ``None`` means ``CKPTSTORE_CACHE`` (``on``/``off``), by default on for remote
    storage only."""
    if isinstance(cache, RestoreCache):
        return cache
    if cache is None:
        choice = env_choice()
        return RestoreCache() if (storage.remote if choice is None else choice) else None
    if isinstance(cache, bool):
        return RestoreCache() if cache else None
    raise errors.InvalidConfig(
        "cache must be True, False, None (the default: on for remote storage) or a "
        f"ckptstore.checkpointing.cache.RestoreCache. Received: {cache!r}"
    )


__all__ = [
    "CACHE_ENV",
    "SIZE_ENV",
    "CacheInfo",
    "CacheOption",
    "LoadStats",
    "RestoreCache",
    "default_root",
    "env_choice",
    "parse_size",
    "resolve",
]
