"""The local restore cache: verified chunks and whole files of checkpoints already loaded on
this machine, so loading a checkpoint again, or the next one of the same trial, fetches only
what this machine does not hold yet.

Layout, under ``<CKPTSTORE_HOME>/cache/`` (``CKPTSTORE_CACHE_DIR`` moves it)::

    blobs/<sha256[:2]>/<sha256>   a format-2 chunk, named by its SHA-256 (shared by every
                                  checkpoint and storage that uses it)
    files/<key[:2]>/<key>         a whole file (format 1, or a format-2 file stored whole);
                                  key = SHA-256 of (storage URL, uuid, path, size, crc32c)
    index.db                      SQLite: one row per entry (size, last use) and recent loads

Choices made where the issue is silent:

- **Never trusted blindly.** A chunk is used only if its bytes hash to its name; a whole file
  only if its size and crc32c match the manifest. A damaged entry (a disk error, or a
  hard-linked copy the user edited in place, see below) is dropped and fetched again.
- **Whole files are keyed by where they come from, not by their crc32c alone.** CRC-32C has 32
  bits: two different ``model.keras`` of the same size collide with probability ~n²/2³³
  (1% at ~9,000 same-size files), and a collision would pass verification. A committed
  checkpoint's files never change, so (storage, uuid, path, size, crc32c) names one content.
  Sharing across checkpoints is what format 2's SHA-256 chunks are for.
- **Hard links.** A download into a folder hard-links whole files from the cache (a copy when
  the folder is on another file system), and a whole file fetched from storage is linked into
  the cache. A user who then edits that file *in place* edits the cache entry too: the next
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
  not kept.
- **When.** On by default for remote storage (``Storage.remote``: S3, GCS, Azure); a local or
  shared-file-system storage is read in place or from the same disk, where a cache would only
  double the bytes on disk. ``cache=True`` or ``CKPTSTORE_CACHE=on`` turns it on for every
  storage (e.g. a slow network file system), ``cache=False`` or ``CKPTSTORE_CACHE=off`` off. The cache is local: storage GC never looks at it.

Example::

    from ckptstore.checkpointing.cache import RestoreCache

    cache = RestoreCache(limit="2GB")
    print(cache.info())            # CacheInfo(root=..., size=..., entries=..., hit_rate=...)
    cache.clear()
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptstore import defaults, errors
from ckptstore.checkpointing.checksums import crc32c_file
from ckptstore.storage_backends.object_store import tmp_name

if TYPE_CHECKING:
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
    """Bytes one load took from storage and from the cache, and the entries it used or added
    (thread-safe: chunks are fetched on several threads)."""

    from_storage: int = 0
    from_cache: int = 0
    used: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, key: str, size: int, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self.from_cache += size
            else:
                self.from_storage += size
            if key:
                self.used[key] = size


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
            limit = os.environ[SIZE_ENV]
        self._limit = None if limit is None else parse_size(limit, name="limit")

    def __repr__(self) -> str:
        return f"RestoreCache(root={str(self.root)!r}, limit={self._limit!r})"

    # ---- entries -------------------------------------------------------------------------------
    @staticmethod
    def blob_key(sha256: str) -> str:
        return f"blobs/{sha256[:2]}/{sha256}"

    @staticmethod
    def file_key(storage_url: str, uuid: str, rel: str, entry: Mapping[str, Any]) -> str:
        name = "\0".join([storage_url, uuid, rel, str(entry["size"]), entry["crc32c"]])
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        return f"files/{digest[:2]}/{digest}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def read_blob(self, sha256: str, size: int) -> bytes | None:
        """The chunk's bytes if cached and intact; a damaged entry is dropped (None)."""
        path = self._path(self.blob_key(sha256))
        try:
            with open(path, "rb") as f:
                data = f.read(size + 1)
        except OSError:
            return None
        if len(data) == size and hashlib.sha256(data).hexdigest() == sha256:
            return data
        self._drop(path, f"chunk {sha256}")
        return None

    def link_file(self, key: str, target: str, entry: Mapping[str, Any]) -> bool:
        """Put the cached whole file ``key`` at ``target`` (hard link, else copy) if it matches
        ``entry``'s size and crc32c; a damaged entry is dropped. True if it was placed."""
        path = self._path(key)
        part = tmp_name(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            _link_or_copy(path, part)
        except FileNotFoundError:
            return False
        # Checked on the link, not the entry's name: an eviction meanwhile cannot swap it.
        if os.path.getsize(part) == entry["size"] and crc32c_file(part) == entry["crc32c"]:
            os.replace(part, target)
            return True
        os.unlink(part)
        self._drop(path, f"file {key}")
        return False

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` as entry ``key`` (renamed into place; best effort: a full disk or a
        read-only cache costs the saving, never the load)."""
        path = self._path(key)
        with self._best_effort(key):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part = tmp_name(path)
            with open(part, "wb") as f:
                f.write(data)
            os.replace(part, path)

    def put_file(self, key: str, source: str) -> None:
        """Store the file at ``source`` as entry ``key`` (hard link, else copy)."""
        path = self._path(key)
        with self._best_effort(key):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            part = tmp_name(path)
            _link_or_copy(source, part)
            os.replace(part, path)

    @contextlib.contextmanager
    def _best_effort(self, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            logger.warning("Restore cache %s: could not keep %s (%s)", self.root, key, exc)

    def _drop(self, path: str, what: str) -> None:
        logger.warning(
            "Restore cache %s: %s is damaged; dropped, fetching it again", self.root, what
        )
        with contextlib.suppress(OSError):
            os.unlink(path)

    # ---- the index -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        os.makedirs(self.root, exist_ok=True)
        db = sqlite3.connect(self.root / "index.db", timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS entries"
                " (key TEXT PRIMARY KEY, size INTEGER NOT NULL, used REAL NOT NULL)"
            )
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
        os.makedirs(self.root, exist_ok=True)
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
                for key, size in stats.used.items():
                    if os.path.isfile(self._path(key)):
                        db.execute(
                            "INSERT INTO entries VALUES (?, ?, ?) ON CONFLICT(key)"
                            " DO UPDATE SET used = excluded.used, size = excluded.size",
                            (key, size, now),
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

    def _evict(self, db: sqlite3.Connection) -> None:
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
            for sub in ("blobs", "files"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
            db.execute("DELETE FROM entries")
            db.execute("DELETE FROM loads")
            db.execute("COMMIT")
        return int(size)


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
