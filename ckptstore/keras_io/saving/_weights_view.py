"""The weights of a ``.keras`` archive as a ``*.weights.h5`` file, without Keras's zip reader.

``model.load_weights("model.keras")`` streams ``model.weights.h5`` out of the zip through
Python's ``zipfile`` (every HDF5 read a Python call, backward seeks re-reading the entry):
about 10x slower than ``model.load_weights("x.weights.h5")`` of the same bytes for a 100 MiB
model. :func:`weights_file` gives a ``*.weights.h5`` path Keras reads with HDF5's own file
driver, in the cheapest form the archive allows:

- ``linked``: a symbolic link to the archive itself, when the weights' bytes start where HDF5
  looks for a superblock (0, 512, 1024, ...): archives ckptstore writes put them at 512
  (:data:`._keras_archive.WEIGHTS_DATA_OFFSET`), and HDF5 reads the archive as a file with a
  user block. No byte is copied.
- ``extracted``: a copy of the weights' byte range (stored entries: in the kernel where it can),
  for archives written before, or by Keras.
- ``inflated``: a compressed entry, decompressed once into the copy.

Example::

    with weights_file("ckpt/model.keras") as (path, how):
        model.load_weights(path)
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

from ckptstore.checkpointing.chunk_view import ChunkedFile
from ckptstore.keras_io.saving import _skipsets as skipsets
from ckptstore.keras_io.saving._keras_archive import WEIGHTS_NAME
from ckptstore.keras_io.saving._optimizers import attribute_optimizers
from ckptstore.storage_backends.local import copy_range

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
#: Bytes per step when inflating a compressed entry.
_COPY_STEP = 8 << 20


def _data_offset(fd: int | ChunkedFile, info: zipfile.ZipInfo) -> int:
    """Where the bytes of entry ``info`` begin (after its local header and extra field)."""
    if isinstance(fd, ChunkedFile):
        header = fd.pread(info.header_offset, _LOCAL_HEADER.size)
    else:
        header = os.pread(fd, _LOCAL_HEADER.size, info.header_offset)
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    return info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]


def _hdf5_reads_at(fd: int, offset: int) -> bool:
    """Whether HDF5 opening the archive finds the superblock at ``offset`` (and nowhere before
    it: it takes the first of 0, 512, 1024, ... that holds the signature)."""
    if offset and (offset < 512 or offset & (offset - 1)):
        return False
    candidates = [0] + [1 << k for k in range(9, offset.bit_length())]
    if os.pread(fd, len(_HDF5_SIGNATURE), offset) != _HDF5_SIGNATURE:
        return False
    return all(
        os.pread(fd, len(_HDF5_SIGNATURE), at) != _HDF5_SIGNATURE
        for at in candidates
        if at < offset
    )


def place_weights(keras_file: str, target: str) -> str | None:
    """Make ``target`` (a ``*.weights.h5`` path) hold the weights of ``keras_file``; returns
    how (``"linked"``, ``"extracted"``, ``"inflated"``), or None if the archive has no weights
    entry or is not a readable zip (the caller lets Keras report it in its own words)."""
    try:
        with zipfile.ZipFile(keras_file) as archive:
            info = archive.getinfo(WEIGHTS_NAME)
            if info.compress_type != zipfile.ZIP_STORED:
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, _COPY_STEP)
                return "inflated"
    except (KeyError, zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
    fd = os.open(keras_file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            offset = _data_offset(fd, info)
        except (zipfile.BadZipFile, struct.error, OSError):
            return None
        if offset + info.file_size > os.fstat(fd).st_size:
            return None
        if _hdf5_reads_at(fd, offset):
            os.symlink(os.path.abspath(keras_file), target)
            return "linked"
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if copy_range(fd, out, info.file_size, offset, 0) != info.file_size:
                return None  # the archive ends inside its weights: Keras says it is damaged
        finally:
            os.close(out)
        return "extracted"
    finally:
        os.close(fd)


class RangeFile(io.BytesIO):
    """Bytes ``[base, base + size)`` of a :class:`ChunkedFile` as a read-only file object,
    named ``name`` by ``str()``. A ``BytesIO`` subclass because Keras's ``H5IOStore`` takes a
    path or a ``BytesIO`` (and picks its reader by the name's ending); h5py reads it through
    ``seek`` + ``readinto``, zipfile through ``seek`` + ``read``."""

    def __init__(self, view: ChunkedFile, base: int, size: int, name: str) -> None:
        super().__init__()
        self.view, self.base, self.length, self.name, self.pos = view, base, size, name, 0

    @classmethod
    def whole(cls, view: ChunkedFile) -> RangeFile:
        """All of ``view``'s bytes (the archive itself), named as the view."""
        return cls(view, 0, view.size, view.name)

    def __str__(self) -> str:
        return self.name

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, pos + (0, self.pos, self.length)[whence])
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        want = max(0, min(len(view), self.length - self.pos))
        got = self.view.readinto(view[:want], self.base + self.pos) if want else 0
        self.pos += got
        return got

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self.length - self.pos)
        buf = bytearray(left if size is None or size < 0 else min(size, left))
        return bytes(buf[: self.readinto(buf)])


def _weights_in_place(view: ChunkedFile) -> RangeFile | None:
    """The weights entry of the archive ``view`` holds, read in place, when it is stored
    uncompressed; else None."""
    try:
        with zipfile.ZipFile(RangeFile.whole(view)) as archive:
            info = archive.getinfo(WEIGHTS_NAME)
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        offset = _data_offset(view, info)
    except (KeyError, zipfile.BadZipFile, struct.error, OSError, EOFError, ValueError):
        return None
    if offset + info.file_size > view.size:
        return None
    return RangeFile(view, offset, info.file_size, f"{view.name}/{WEIGHTS_NAME}")


def _copy_out(view: ChunkedFile, target: str) -> None:
    """Write the whole file ``view`` reads into ``target``."""
    buf = bytearray(_COPY_STEP)
    with open(target, "wb") as f:
        for at in range(0, view.size, _COPY_STEP):
            f.write(memoryview(buf)[: view.readinto(buf, at)])


@contextlib.contextmanager
def weights_file(keras_file: str | ChunkedFile) -> Iterator[tuple[str | RangeFile, str | None]]:
    """Yield ``(path, how)``: a ``*.weights.h5`` path holding ``keras_file``'s weights (see
    :func:`place_weights`; removed on exit), or ``(keras_file, None)`` when only Keras's own
    reader can tell what is wrong with it. A :class:`ChunkedFile` (an archive read in place
    from its chunks) yields a :class:`RangeFile` of its weights (``how``: ``"in place"``),
    or, for a compressed one, the weights of a copy of it."""
    in_place = _weights_in_place(keras_file) if isinstance(keras_file, ChunkedFile) else None
    if in_place is not None:
        yield in_place, "in place"
        return
    scratch = tempfile.mkdtemp(prefix="ckptstore-weights-")
    try:
        target = os.path.join(scratch, "model.weights.h5")
        if isinstance(keras_file, ChunkedFile):
            _copy_out(keras_file, os.path.join(scratch, "model.keras"))
            keras_file = os.path.join(scratch, "model.keras")
        how = place_weights(keras_file, target)
        yield (target if how else keras_file), how
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _built_by_its_layers(model: Any) -> None:
    """Mark a subclassed model built when every layer it holds is: one whose ``call`` a custom
    ``train_step`` never runs (a GAN training its generator and discriminator itself) stays
    unbuilt, and Keras refuses to load weights into it although all its variables exist (the
    checkpoint was written from those same variables)."""
    layers = getattr(model, "_flatten_layers", None)
    if getattr(model, "built", True) or not callable(layers) or not model.weights:
        return
    if all(layer.built for layer in layers(include_self=False)):
        model.built = True


def load_weights(
    model: Any, keras_file: str | ChunkedFile, *, with_optimizer: bool = True
) -> str | None:
    """Load the weights of archive ``keras_file`` into ``model`` through :func:`weights_file`
    (with its optimizer's state, or leaving the optimizer as it is); returns how they were
    read (:func:`place_weights`)."""
    from keras.src.saving import saving_lib

    skipsets.prime(model)  # Keras's walk then builds no throwaway Layer() per layer
    _built_by_its_layers(model)
    with weights_file(keras_file) as (path, how):
        if with_optimizer:
            model.load_weights(path)
        else:
            # the model's own optimizers too (a GAN's), which a warm start leaves fresh
            skip = [*attribute_optimizers(model).values()]
            if getattr(model, "optimizer", None) is not None:
                skip.append(model.optimizer)
            saving_lib.load_weights_only(model, path, objects_to_skip=skip or None)
    skipsets.share()  # the optimizer's and metrics' too, for the walks that follow
    return how


__all__ = ["RangeFile", "load_weights", "place_weights", "weights_file"]
