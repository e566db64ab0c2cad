"""``CheckpointContext``: Determined's ``core_context.checkpoint`` on any storage."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import tempfile
import threading
import uuid as _uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing import (
    blobs,
    cache_view,
    chunk_view,
    commit,
    restore,
    scan,
    sharded,
    signing,
)
from ckptstore.checkpointing import cache as cache_mod
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.blobs import DEFAULT_CHUNK_BYTES, check_chunk_bytes
from ckptstore.checkpointing.collecting import Collecting
from ckptstore.checkpointing.collector import DEFAULT_GRACE_SECONDS
from ckptstore.checkpointing.distributed import ProcessGroup
from ckptstore.checkpointing.download_mode import DownloadMode, check_download_mode
from ckptstore.checkpointing.hints import CommitHints
from ckptstore.checkpointing.index import CheckpointIndex
from ckptstore.checkpointing.pins import DEFAULT_PIN_LEASE_SECONDS, PinKeeper
from ckptstore.checkpointing.reconcile import newest_in_storage
from ckptstore.checkpointing.retention import GCPolicy
from ckptstore.checkpointing.uploader import BackgroundUploader, snapshot_dir
from ckptstore.storage_backends import Storage
from ckptstore.storage_backends.local import check_links_inside
from ckptstore.storage_backends.spec import StorageConfig
from ckptstore.validators import number_at_least

logger = logging.getLogger(__name__)


class CheckpointContext(Collecting):
    """Save, load, delete and garbage-collect checkpoints, with Determined's method names.

    A checkpoint is a folder ``<storage>/<uuid>/`` committed by its ``MANIFEST.json``; see
    :mod:`ckptstore.checkpointing.format`.

    Args:
        storage: a :class:`~ckptstore.storage_backends.Storage`, a URL (``s3://b/p``,
            ``/mnt/ckpts``) or a Determined ``checkpoint_storage`` dict.
        index: an object implementing
            :class:`~ckptstore.checkpointing.index.CheckpointIndex` (the registry). Without it,
            everything works from storage alone.
        trial_id: written into each checkpoint's metadata; scope of GC.
        experiment_id: written into each checkpoint's metadata; scope of GC.
        distributed: a :class:`ProcessGroup` (default: one process).
        gc_policy: a :class:`~ckptstore.checkpointing.retention.GCPolicy` or a dict of Determined's
            keys (``save_trial_latest``, ...); run after every commit. None keeps everything.
        verify: check sizes and crc32c of downloaded files (``False`` skips it).
        max_in_flight: background uploads running at once; the caller blocks beyond it.
        storage_url: the storage URL recorded in the index (default ``storage.url``).
        gc_grace_seconds: uncommitted folders younger than this are not removed by GC, and
            PENDING index rows younger than this are not reconciled to DELETED.
        pin_lease_seconds: lifetime of the index pins :meth:`protect` and
            :meth:`restore_path` take (renewed every third of it while held); a crashed
            process protects its checkpoints at most this long.
        dedup: incremental checkpoints (content-addressed chunks, format 2; see
            :mod:`.blobs`). None (default): the ``dedup`` key of a storage dict, else on, on
            every storage (local paths and ``shared_fs`` included, where ``saved_model/`` stays
            whole in the folder: :func:`~ckptstore.checkpointing.format.kept_whole_in_place`).
            False turns it off for this context.
        dedup_chunk_bytes: the largest chunk (default 4 MiB); writers cut at tensor
            boundaries below it.
        cache: the local restore cache downloads use (:mod:`.cache`): None (default) = on
            for remote storage unless ``CKPTSTORE_CACHE=off``; True/False; or a
            :class:`~ckptstore.checkpointing.cache.RestoreCache`.

    With an index, the chief reconciles the trial's PENDING rows with storage at start-up
    (see :meth:`reconcile`), so a checkpoint committed by a run killed before it updated the
    index is found by ``latest_checkpoint``. Protection (:meth:`protect`, checkpoints in use
    by :meth:`restore_path`) is pinned in the index when it supports pins (the registry
    does), so GC in other processes honours it; without an index it is known only to this
    process (storage-only mode: run GC where the protecting process runs, or use a registry).

    Example::

        from ckptstore.checkpointing import CheckpointContext

        with CheckpointContext("/tmp/ckpts", trial_id=1) as ctx:
            with ctx.store_path({"steps_completed": 10}) as (path, uuid):
                open(f"{path}/weights.txt", "w").write("...")
            with ctx.restore_path(uuid) as path:
                print(open(f"{path}/weights.txt").read())
    """

    def __init__(
        self,
        storage: Storage | str | Mapping[str, Any] | StorageConfig,
        *,
        index: CheckpointIndex | None = None,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        distributed: ProcessGroup | None = None,
        gc_policy: GCPolicy | Mapping[str, Any] | None = None,
        verify: bool = True,
        max_in_flight: int = 2,
        storage_url: str | None = None,
        gc_grace_seconds: float = DEFAULT_GRACE_SECONDS,
        pin_lease_seconds: float = DEFAULT_PIN_LEASE_SECONDS,
        owns_storage: bool | None = None,
        dedup: bool | None = None,
        dedup_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        cache: cache_mod.CacheOption = None,
        signing_key: str | os.PathLike[str] | None = None,
        verify_key: str | os.PathLike[str] | None = None,
    ) -> None:
        # A storage opened here is closed here; a caller that opened it may hand it over
        # (owns_storage=True) so there is exactly one owner.
        given = StorageConfig.parse(storage)
        self._owns_storage = given.instance is None if owns_storage is None else owns_storage
        self.storage: Storage = given.open()
        self.storage_url = storage_url or self.storage.url
        self.index = index
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        #: The checkpoint this run started from (``core.init`` sets it when it resumes a
        #: trial); written as ``resumed_from`` into the metadata of each checkpoint it saves.
        self.resumed_from: str | None = None
        self.distributed = distributed or ProcessGroup.single()
        self.gc_policy = GCPolicy.from_config(
            dict(gc_policy) if isinstance(gc_policy, Mapping) else gc_policy
        )
        self.verify = bool(verify)
        #: EC private key (PEM file) signing every commit, and the trusted public key every
        #: download/restore is verified against (:mod:`.signing`); default: the environment.
        self.signing_key = signing.key_from(signing_key, signing.SIGNING_KEY_ENV)
        self.verify_key = signing.verify_key(verify_key)
        if self.signing_key or self.verify_key:
            signing.load_model_signing()  # here, not at the first commit (a one-off ~1 s import)
        #: Store files as content-addressed chunks (format 2, :mod:`.blobs`): unchanged chunks
        #: are not stored again. On by default on every storage: on object stores every byte
        #: is uploaded and billed, on local disk and shared file systems every checkpoint of
        #: a fine-tuning run would otherwise hold the whole model again. The one owner of
        #: this default; ``dedup=False`` (or ``dedup: false`` in the storage dict) opts out.
        if dedup is None:
            dedup = given.dedup
        self.dedup = True if dedup is None else bool(dedup)
        self.dedup_chunk_bytes = check_chunk_bytes(dedup_chunk_bytes)
        self.cache = cache_mod.resolve(cache, self.storage)
        #: What the last :meth:`download` of this context fetched (storage vs cache bytes).
        self.last_download: restore.DownloadReport | None = None
        #: Blobs our last deduplicated commit named: the next one does not ask storage about them.
        self._known_blobs = blobs.KnownBlobs()
        self.gc_grace_seconds = number_at_least("gc_grace_seconds", gc_grace_seconds, 0)
        self._pins = PinKeeper(index, lease_seconds=pin_lease_seconds)
        self._uploader = BackgroundUploader(max_in_flight)
        #: Checkpoints this context is committing in the caller's thread (``upload``,
        #: ``store_path``): this context's GC must not take them for stale leftovers.
        self._committing: set[str] = set()
        self._protected: set[str] = set()
        self._in_use: dict[str, int] = {}  # local checkpoints yielded by restore_path
        self._protected_lock = threading.Lock()
        self._gc_executor = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-gc")
        self._gc_lock = threading.Lock()  # one collection at a time
        self._gc_flag_lock = threading.Lock()
        self._gc_future: Future[list[str]] | None = None
        self._gc_queued = False
        self._closed = False
        self._deferred: list[Callable[[], None]] = []
        if self.index is not None and self.distributed.rank == 0:
            try:
                self.reconcile()
            except Exception as exc:  # noqa: BLE001 - a repair must never stop a run starting
                logger.warning("Reconciling PENDING checkpoints at start-up failed: %s", exc)

    def __repr__(self) -> str:
        return f"CheckpointContext({self.storage!r}, trial_id={self.trial_id!r})"

    # ---- saving ------------------------------------------------------------------------------
    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: Mapping[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Any = None,
        background: bool = False,
        move: bool = False,
    ) -> str:
        """Save the files of ``ckpt_dir`` as a new checkpoint; returns its UUID.

        With ``background=True`` the files are snapshotted first (copied, or cloned where the
        file system can) and uploaded on a worker thread; the call returns once the snapshot
        is taken (and blocks while ``max_in_flight`` uploads run). With ``move=True`` the
        caller hands ``ckpt_dir`` over: it is moved or uploaded from in place, never copied,
        and removed afterwards. With ``shard=True`` every rank must call it and uploads its
        own files into one checkpoint; a rank with nothing to add passes ``ckpt_dir=None``.
        ``selector`` (a callable on relative paths, a glob or a list of globs) uploads only the
        files it picks, as in Determined.
        """
        if ckpt_dir is None or selector is not None:
            return self.upload(
                self._picked_copy(ckpt_dir, selector),
                metadata,
                shard=shard,
                background=background,
                move=True,
            )
        self._check_open()
        self._uploader.raise_pending_error()
        ckpt_dir = os.fspath(ckpt_dir)
        if not os.path.isdir(ckpt_dir):
            raise errors.InvalidConfig(
                f"ckpt_dir {ckpt_dir!r} is not a folder; pass the folder holding the "
                "checkpoint files."
            )
        if shard and self.distributed.size > 1:
            if background:
                raise errors.InvalidConfig(
                    "background=True is not supported with shard=True across several workers; "
                    "use background=False for sharded uploads."
                )
            uuid = sharded.agree_on_uuid(self.storage, self.distributed)
            self._commit_sharded(uuid, ckpt_dir, metadata)
            return uuid
        self._check_chief(shard)
        uuid = str(_uuid.uuid4())
        full_metadata = self._build_metadata(uuid, metadata)
        if not background:
            self._commit(uuid, ckpt_dir, full_metadata, owned=move)
            if move:
                shutil.rmtree(ckpt_dir, ignore_errors=True)
            return uuid
        # The content rule (names, symlinks) is checked here, in the caller's thread, so a
        # refused file raises now instead of from a later wait(); also before a snapshot
        # could follow a symlink.
        fmt.local_files(ckpt_dir)
        self._uploader.acquire_slot()
        try:
            if move:
                staging = ckpt_dir
            else:
                staging = self._staging_dir(uuid, create=False)
                snapshot_dir(ckpt_dir, staging)
        except BaseException:
            self._uploader.release_slot()
            raise
        self._submit(uuid, staging, full_metadata)
        return uuid

    def _picked_copy(self, ckpt_dir: str | os.PathLike[str] | None, selector: Any) -> str:
        """A new folder holding the files of ``ckpt_dir`` that ``selector`` picks (hard links
        where possible), to upload with ``move=True``; empty for ``ckpt_dir=None``."""
        picked = tempfile.mkdtemp(prefix="ckptstore-upload-")
        if ckpt_dir is None:
            return picked
        select = fmt.compile_selector(selector)
        for rel, full in fmt.local_files(os.fspath(ckpt_dir)).items():
            if rel.endswith("/") or not select(rel):
                continue
            target = os.path.join(picked, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(full, target)
            except OSError:  # another file system: copy instead
                shutil.copy2(full, target)
        return picked

    @contextlib.contextmanager
    def store_path(
        self,
        metadata: Mapping[str, Any] | None = None,
        shard: bool = False,
        *,
        background: bool = False,
        checksums: dict[str, str] | None = None,
        cuts: dict[str, list[int]] | None = None,
        hints: CommitHints | None = None,
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """Yield ``(path, uuid)``: write the checkpoint files into ``path`` (a ``pathlib.Path``,
        as Determined yields); they are committed
        when the block exits (discarded if it raises). On a local file system ``path`` is a
        staging folder beside the final one that is renamed into place. With
        ``background=True`` the folder is handed over (moved, not copied) and uploaded on a
        worker thread.

        ``checksums``: an optional dict the block may fill with ``{relpath: crc32c}`` (8 hex
        digits) for files it wrote and checksummed while writing; the manifest then uses those
        values instead of reading the files again. ``cuts``: likewise ``{relpath: [offset,
        ...]}``, where the pieces of a file's content (its tensors) begin and end; with
        ``dedup`` its chunks are cut there, so a changed tensor costs its own bytes. Both are
        ignored with ``shard=True``. ``hints``: both as one
        :class:`~ckptstore.checkpointing.hints.CommitHints` (what the Keras writer passes)."""
        self._check_open()
        self._uploader.raise_pending_error()
        if shard and self.distributed.size > 1:
            if background:
                raise errors.InvalidConfig(
                    "background=True is not supported with shard=True across several workers."
                )
            uuid = sharded.agree_on_uuid(self.storage, self.distributed)
            path = tempfile.mkdtemp(prefix=f"ckptstore-shard-{uuid}-")
            try:
                yield pathlib.Path(path), uuid
                self._commit_sharded(uuid, path, metadata)
            finally:
                shutil.rmtree(path, ignore_errors=True)
            return
        self._check_chief(shard)
        uuid = str(_uuid.uuid4())
        path = self._staging_dir(uuid, create=True)
        try:
            yield pathlib.Path(path), uuid
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        try:
            full_metadata = self._build_metadata(uuid, metadata)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        if hints is not None:  # read now: the writer fills them until the block exits
            checksums = {**(checksums or {}), **hints.checksums}
            cuts = {**(cuts or {}), **hints.cuts}
        known = dict(checksums) if checksums else None
        known_cuts = {r: list(c) for r, c in cuts.items()} if cuts else None
        if not background:
            try:
                self._commit(
                    uuid, path, full_metadata, owned=True, checksums=known, cuts=known_cuts
                )
            finally:
                shutil.rmtree(path, ignore_errors=True)
            return
        try:
            fmt.local_files(path)  # a refused name raises here, not from a later wait()
            self._uploader.acquire_slot()
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self._submit(uuid, path, full_metadata, checksums=known, cuts=known_cuts)

    def write_once_chunk_bytes(self) -> int | None:
        """The chunk size a writer that knows its file's layout may write a file of a
        ``store_path()`` folder in, one part per chunk (:class:`~ckptstore.checkpointing.
        blobs.SplitFile`), or None when the commit would copy it anyway: the store is not a
        local folder, checkpoints are not deduplicated, or a signature reads every byte."""
        if not self.dedup or self.signing_key is not None:
            return None
        if self.storage.local_path(fmt.STAGING_PREFIX) is None:
            return None
        return self.dedup_chunk_bytes

    def _build_metadata(self, uuid: str, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        built = ckpt_metadata.build_metadata(
            uuid, metadata, trial_id=self.trial_id, experiment_id=self.experiment_id
        )
        if self.resumed_from is not None:  # a caller's own "resumed_from" wins
            built.setdefault("resumed_from", self.resumed_from)
        return built

    def _check_chief(self, shard: bool) -> None:
        if not shard and self.distributed.rank != 0:
            raise errors.InvalidConfig(
                f"Only the chief (rank 0) may save a non-sharded checkpoint; this is rank "
                f"{self.distributed.rank}. Save on rank 0 only, or pass shard=True on every rank."
            )

    def _staging_dir(self, uuid: str, *, create: bool) -> str:
        """A folder we own for ``uuid``: beside the final one on local storage, else in /tmp."""
        local = self.storage.local_path(fmt.STAGING_PREFIX + uuid)
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if create:
                os.makedirs(local)
            return local
        path = tempfile.mkdtemp(prefix=f"ckptstore-{uuid}-")
        if not create:
            os.rmdir(path)
        return path

    def _commit(
        self,
        uuid: str,
        local_dir: str,
        metadata: dict[str, Any],
        *,
        owned: bool,
        checksums: dict[str, str] | None = None,
        cuts: dict[str, list[int]] | None = None,
    ) -> None:
        with self._committing_now(uuid):
            self._commit_dir(uuid, local_dir, metadata, owned, checksums, cuts)
        self._after_commit()

    def _commit_sharded(
        self, uuid: str, local_dir: str, metadata: Mapping[str, Any] | None
    ) -> None:
        """Every rank's files of ``local_dir`` into checkpoint ``uuid`` (in the context's
        format: deduplicated or whole files)."""
        with self._committing_now(uuid):
            sharded.commit_sharded(
                self.storage,
                self.distributed,
                uuid,
                local_dir,
                metadata,
                build_metadata=self._build_metadata,
                index=self.index,
                storage_url=self.storage_url,
                dedup_chunk_bytes=self.dedup_chunk_bytes if self.dedup else None,
                signing_key=self.signing_key,
            )
        self._after_commit()

    @contextlib.contextmanager
    def _committing_now(self, uuid: str) -> Iterator[None]:
        with self._protected_lock:
            self._committing.add(uuid)
        try:
            yield
        finally:
            with self._protected_lock:
                self._committing.discard(uuid)

    def _in_flight(self) -> list[str]:
        """Uploads of this context not finished: background jobs and commits in progress."""
        with self._protected_lock:
            committing = list(self._committing)
        return self._uploader.in_flight + committing

    def _commit_dir(
        self,
        uuid: str,
        local_dir: str,
        metadata: dict[str, Any],
        owned: bool,
        checksums: dict[str, str] | None,
        cuts: dict[str, list[int]] | None,
    ) -> None:
        # Signed here, on the upload thread for background saves: over the logical files, so
        # a deduplicated checkpoint's download verifies; the signature is one more file.
        commit.commit_dir(
            self.storage,
            uuid,
            local_dir,
            metadata,
            owned=owned,
            index=self.index,
            storage_url=self.storage_url,
            checksums=checksums,
            dedup_chunk_bytes=self.dedup_chunk_bytes if self.dedup else None,
            cuts=cuts,
            known_blobs=self._known_blobs,
            signing_key=self.signing_key,
        )

    def _submit(
        self,
        uuid: str,
        staging: str,
        metadata: dict[str, Any],
        checksums: dict[str, str] | None = None,
        cuts: dict[str, list[int]] | None = None,
    ) -> None:
        self._uploader.submit(
            uuid,
            lambda: self._commit(
                uuid, staging, metadata, owned=True, checksums=checksums, cuts=cuts
            ),
            cleanup=lambda: shutil.rmtree(staging, ignore_errors=True),
        )

    # ---- loading -----------------------------------------------------------------------------
    def _manifest(self, storage_id: str) -> fmt.Manifest:
        try:
            return fmt.load_manifest(self.storage, storage_id)
        except errors.InvalidCheckpoint:
            if not self.storage.exists(storage_id):
                raise errors.CheckpointNotFound(self._not_here(storage_id)) from None
            raise

    def _not_here(self, storage_id: str) -> str:
        """Why ``storage_id`` is not in this storage: in another one, if the index says so (a
        trial trained on a bucket and run again on the default storage read "No checkpoint")."""
        from ckptstore.checkpointing.row_storage import is_under
        from ckptstore.masking import mask_text

        recorded = ""
        with contextlib.suppress(errors.CkptstoreError, AttributeError):
            recorded = self.index.get_checkpoint(storage_id).storage_url or ""  # type: ignore[union-attr]
        if recorded and not is_under(recorded, self.storage_url):
            return (
                f"Checkpoint {storage_id} is not in {self.storage.url}: the registry records it "
                f"in {mask_text(recorded)}. Open that storage to read or resume it (storage=, "
                "--storage or CKPTSTORE_STORAGE), or start a new trial (core.init() without "
                "trial_id)."
            )
        return (
            f"No checkpoint {storage_id} in {self.storage.url}; check the UUID and the "
            "storage URL (list them with ckptstore.checkpointing.list_committed)."
        )

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode | str = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Any = None,
        cache: cache_mod.CacheOption = None,
    ) -> None:
        """Download committed checkpoint ``storage_id`` (or the files ``selector`` picks: a
        callable on relative paths, a glob or a list of globs) into ``ckpt_dir``, verifying
        sizes and checksums unless ``verify=False``. ``download_mode`` is Determined's argument;
        both modes give the same files (see :mod:`~ckptstore.checkpointing.download_mode`).
        Files already in the restore cache are linked from it (``cache``: this call's choice,
        default the context's; :attr:`last_download` says what came from where)."""
        check_download_mode(download_mode)
        self._check_open()
        manifest = self._manifest(storage_id)
        select = fmt.compile_selector(selector)
        ckpt_dir = os.fspath(ckpt_dir)
        options = {
            "verify": self.verify,
            "cache": (self.cache or False) if cache is None else cache,
        }
        what = (self.storage, storage_id, manifest, ckpt_dir, lambda rel: bool(select(rel)))
        if self.verify_key is None:
            self.last_download = restore.download_checkpoint(*what, **options)
            return
        # Checked before anyone parses a file: a load raises here, never inside Keras.
        self.last_download = restore.download_signed(
            *what, self.verify_key, partial=selector is not None, **options
        )

    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode | str = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Any = None,
    ) -> contextlib.AbstractContextManager[pathlib.Path]:
        """Yield a local folder (a ``pathlib.Path``) holding committed checkpoint
        ``storage_id``. On a local file system this is the checkpoint folder itself (verified;
        treat it as read-only); otherwise a temporary download removed on exit.
        ``download_mode``: as in :meth:`download`."""
        check_download_mode(download_mode)
        return self.read_in_place(storage_id, selector=selector)

    @contextlib.contextmanager
    def read_in_place(
        self, storage_id: str, *, selector: Any = None, views: dict[str, Any] | None = None
    ) -> Iterator[pathlib.Path]:
        """:meth:`restore_path`, and ``views``: ``{relpath: None}`` of files the caller can
        read through a view (:func:`.chunk_view.open_views`: read in place from the chunks of
        a local store; :func:`.cache_view.open_views`: from the restore cache), open until
        the context exits."""
        self._check_open()
        fmt.check_storage_id(storage_id)
        # GC (here, and in other processes through an index pin) must not delete it while in
        # use; pinned before the manifest is read, so a GC that missed the pin already
        # removed the manifest and we fail cleanly with CheckpointNotFound.
        self._use(storage_id, +1)
        try:
            local = self.storage.local_path(storage_id)
            manifest = self._manifest(storage_id)
            # With a verify key, a selection is copied out: in place, the caller would get
            # the whole folder, its unselected files unchecked.
            signed_part = self.verify_key is not None and selector is not None
            in_place = local is not None and os.path.isdir(local) and not signed_part
            if in_place and not manifest.deduplicated:
                # The caller reads this folder itself: no link in it may lead out of it.
                check_links_inside(local, local, self.storage.local_path("") or local)
                self._verify_in_place(local, manifest, selector)
                yield pathlib.Path(local)
                return
            path = tempfile.mkdtemp(prefix=f"ckptstore-restore-{storage_id}-")
            try:
                selector = chunk_view.open_views(self, manifest, selector, views)
                selector = cache_view.open_views(self, manifest, selector, views, path)
                self.download(storage_id, path, selector=selector)
                yield pathlib.Path(path)
            finally:
                cache_view.close_views(views)
                shutil.rmtree(path, ignore_errors=True)
        finally:
            self._use(storage_id, -1)

    def _verify_in_place(self, local: str, manifest: fmt.Manifest, selector: Any) -> None:
        """Check a local checkpoint folder read in place: sizes and crc32c (``verify``), and
        with a verify key its signature (the envelope first, then the files' SHA-256 from
        the same read as their crc32c)."""
        if self.verify_key is None:
            if self.verify:
                fmt.verify_files(local, manifest, selector)
            return
        sig = os.path.join(local, signing.SIGNATURE_NAME)
        signed = signing.SIGNATURE_NAME in manifest.files and os.path.isfile(sig)
        expected = signing.envelope(local, signed, sig, self.verify_key, subject=manifest.uuid)
        digests: dict[str, str] = {}
        fmt.verify_files(local, manifest, selector, sha256=digests, check=self.verify)
        digests.update(signing.unlisted_digests(local, manifest.files))
        expected.compare(local, digests, partial=selector is not None)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The ``metadata.json`` of committed checkpoint ``storage_id``."""
        self._check_open()
        self._manifest(storage_id)
        return ckpt_metadata.read_metadata(self.storage, storage_id)

    def latest_checkpoint(self, trial_id: int | None = None) -> str | None:
        """UUID of the newest committed checkpoint (most steps, then newest) of ``trial_id``
        (default: this context's trial; all checkpoints if neither is set), or None. A
        checkpoint the index lists but whose manifest is gone from storage is skipped (logged):
        the newest one that exists is returned. Waits first for checkpoints handed to
        :meth:`defer` (still being committed here)."""
        trial_id = self.trial_id if trial_id is None else trial_id
        self._wait_deferred()  # a checkpoint this process is still committing counts
        if self.index is not None:
            records = self.index.checkpoint_records(trial_id=trial_id)
        else:
            records = scan.scan_checkpoints(self.storage, self.storage_url)
            if trial_id is not None:
                records = [r for r in records if r.trial_id == trial_id]
        if self.index is None:
            records = scan.sort_records(records)
            return records[-1].uuid if records else None
        # The index may name a checkpoint whose manifest is gone (deleted outside ckptstore):
        # take the newest one that exists, with a warning.
        newest = newest_in_storage(
            self.storage,
            reversed(scan.sort_records(records)),
            storage_url=self.storage_url,
            trial_id=trial_id,
        )
        return newest.uuid if newest is not None else None

    # ---- lifecycle ---------------------------------------------------------------------------
    def defer(self, wait: Callable[[], None]) -> None:
        """Make :meth:`wait` and :meth:`close` also wait for work that commits through this
        context from another thread (the Keras callback's writer finishing a checkpoint after
        ``fit()`` returned). ``wait`` is called once, first, and may raise."""
        with self._protected_lock:
            self._deferred.append(wait)

    def wait(self) -> None:
        """Block until every background upload is committed (and the GC it triggered ran);
        raise :class:`~ckptstore.errors.BackgroundUploadError` for the first failure."""
        failure: BaseException | None = None
        try:
            self._wait_deferred()
        except BaseException as exc:  # noqa: BLE001 - raised after the uploads finished
            failure = exc
        try:
            self._uploader.wait()
        finally:
            future = self._gc_future
            if future is not None:
                future.result()
        if failure is not None:
            raise failure

    def _wait_deferred(self) -> None:
        """Run the waiters given to :meth:`defer` (once each); raise the first failure."""
        with self._protected_lock:
            deferred, self._deferred = self._deferred, []
        failure: BaseException | None = None
        for waiter in deferred:
            try:
                waiter()
            except BaseException as exc:  # noqa: BLE001 - raised once all have finished
                failure = failure or exc
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Wait for background work, then release threads (and the storage if we opened it).
        A background failure is raised after everything is released."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._uploader.close()
            self._gc_executor.shutdown(wait=True)
            self._pins.close()
            if self._owns_storage:
                self.storage.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.CheckpointError("This CheckpointContext was closed; create a new one.")

    def __enter__(self) -> CheckpointContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
