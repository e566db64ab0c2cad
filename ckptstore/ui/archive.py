"""A committed checkpoint as one tar stream, read from storage file by file and verified on the
way.

Each file of the manifest is downloaded alone into a temporary folder, checked against its
size and crc32c, appended to the tar and deleted, so the server holds at most one file on disk
and a few MiB in memory whatever the checkpoint's size. The archive holds ``<uuid>/...`` with
``MANIFEST.json``, so ``tar x`` gives a folder ``ckptstore checkpoint verify`` style checks
accept. A file that fails its check aborts the stream (the client sees a broken download, never
a complete-looking archive with a bad file). With ``CKPTSTORE_VERIFY_KEY`` in the UI's
environment the archive is a verified download like any other: an unsigned checkpoint is
refused before the first file, and each file's SHA-256 (from the read that checks its
crc32c) must be the signed one before it joins the archive.

Example::

    for chunk in checkpoint_tar(storage, uuid, manifest):
        out.write(chunk)
"""

from __future__ import annotations

import io
import logging
import os
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from ckptstore.checkpointing import format as ckpt_format
from ckptstore.checkpointing import restore, signing
from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
_DONE = object()


class _Cancelled(Exception):
    pass


class _QueueWriter(io.RawIOBase):
    """A write-only file whose bytes go, in chunks, into a bounded queue."""

    def __init__(self, out: queue.Queue, cancelled: threading.Event) -> None:
        self.out, self.cancelled, self.buffer = out, cancelled, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.buffer += data
        while len(self.buffer) >= CHUNK:
            self._put(bytes(self.buffer[:CHUNK]))
            del self.buffer[:CHUNK]
        return len(data)

    def flush_all(self) -> None:
        if self.buffer:
            self._put(bytes(self.buffer))
            self.buffer.clear()

    def _put(self, item: object) -> None:
        while True:
            if self.cancelled.is_set():
                raise _Cancelled
            try:
                self.out.put(item, timeout=0.5)
                return
            except queue.Full:
                continue


def _write_tar(
    storage: Storage, uuid: str, manifest: ckpt_format.Manifest, writer: _QueueWriter
) -> None:
    tmp = tempfile.mkdtemp(prefix="ckptstore-ui-archive-")
    try:
        expected = _expected_signature(storage, uuid, manifest, tmp)
        digests: dict[str, str] = {}  # SHA-256 from the read that checks each crc32c
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for rel in sorted(manifest.files):
                if rel.endswith("/"):
                    info = tarfile.TarInfo(f"{uuid}/{rel.rstrip('/')}")
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    continue
                one = lambda r, rel=rel: r == rel  # noqa: E731 - the file this step fetches
                # One file at a time, so the archive streams while later files are fetched.
                restore.download_checkpoint(
                    storage, uuid, manifest, tmp, one, sha256=digests if expected else None
                )
                if expected is not None:  # before the file joins the archive
                    expected.compare(tmp, {rel: digests[rel]}, partial=True)
                path = os.path.join(tmp, *rel.split("/"))
                tar.add(path, arcname=f"{uuid}/{rel}", recursive=False)
                os.remove(path)
            if expected is not None:  # every signed file was in it
                expected.compare(tmp, digests)
            data = manifest.to_bytes()
            info = tarfile.TarInfo(f"{uuid}/{ckpt_format.MANIFEST_NAME}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        writer.flush_all()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _expected_signature(
    storage: Storage, uuid: str, manifest: ckpt_format.Manifest, tmp: str
) -> signing.Expected | None:
    """With a verify key in the UI's environment, what the checkpoint's signature vouches for
    (each file is compared with it before it joins the archive); None without one."""
    key = signing.verify_key()
    if key is None:
        return None
    path = os.path.join(tmp, signing.SIGNATURE_NAME)

    def fetch() -> str:
        only = lambda rel: rel == signing.SIGNATURE_NAME  # noqa: E731
        restore.download_checkpoint(storage, uuid, manifest, tmp, only)
        return path

    signed = signing.SIGNATURE_NAME in manifest.files
    expected = signing.envelope(f"{uuid} in {storage.url}", signed, fetch, key, subject=uuid)
    os.remove(path)
    return expected


def checkpoint_tar(storage: Storage, uuid: str, manifest: ckpt_format.Manifest) -> Iterator[bytes]:
    """Chunks of the tar of checkpoint ``uuid`` (a producer thread fills a bounded queue)."""
    out: queue.Queue = queue.Queue(maxsize=8)
    cancelled = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            _write_tar(storage, uuid, manifest, _QueueWriter(out, cancelled))
        except _Cancelled:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            logger.warning("Archive of checkpoint %s failed: %s", uuid, exc)
            failure.append(exc)
        while not cancelled.is_set():
            try:
                out.put(_DONE, timeout=0.5)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=produce, name=f"archive-{uuid[:8]}", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                break
            yield item  # type: ignore[misc]
        if failure:
            raise failure[0]
    finally:
        cancelled.set()
        thread.join(timeout=5)
