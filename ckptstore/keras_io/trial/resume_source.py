"""Reading the checkpoint a TFKerasTrial resumes from: its folder, and its ``model.keras`` read
where it is (issue 41).

:func:`checkpoint_folder` yields ``(folder, view)``: the checkpoint's files, and for a Keras 3
``model.keras`` deduplicated on a local store a verified
:class:`~ckptstore.checkpointing.chunk_view.ChunkedFile` of it, read in place from its chunk
files (never reassembled into the folder; the folder then lacks it). The inference SavedModel
is never fetched, copied or checked. A folder Determined wrote under that name (no
``MANIFEST.json``) is downloaded, its ``code/`` left out. :func:`load_weights` loads the
weights and optimizer state through HDF5's own reader (never the zip reader).

Example::

    with checkpoint_folder(core.checkpoint, uuid) as (path, view):
        load_weights(model, view or os.path.join(path, "model.keras"), uuid)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.checkpointing.chunk_view import ChunkedFile
from ckptstore.checkpointing.format import MANIFEST_NAME, check_storage_id
from ckptstore.keras_io import backend
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving import _weights_view as weights_view
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME, SAVED_MODEL_DIRNAME


def _not_saved_model(rel: str) -> bool:
    return rel.split("/", 1)[0] != SAVED_MODEL_DIRNAME


@contextlib.contextmanager
def checkpoint_folder(ckpt: Any, uuid: str) -> Iterator[tuple[str, ChunkedFile | None]]:
    """``(folder, view)`` of checkpoint ``uuid`` of checkpoint context ``ckpt`` (see the module
    docstring): a committed ckptstore checkpoint, or a folder Determined wrote under that name
    in the storage (it has no MANIFEST.json), which is read in place. Its ``code/`` is not even
    downloaded: nothing in it is imported."""
    check_storage_id(uuid)
    storage = getattr(ckpt, "storage", None)  # None: a checkpoint context of another kind
    if storage is None or storage.exists(f"{uuid}/{MANIFEST_NAME}") or not storage.exists(uuid):
        if not hasattr(ckpt, "read_in_place"):
            with ckpt.restore_path(uuid) as path:
                yield os.fspath(path), None
            return
        views: dict[str, Any] = {} if backend.IS_KERAS2 else {MODEL_FILENAME: None}
        with ckpt.read_in_place(uuid, selector=_not_saved_model, views=views) as path:
            yield os.fspath(path), views.get(MODEL_FILENAME)
        return
    with tempfile.TemporaryDirectory(prefix=f"ckptstore-det-{uuid}-") as tmp:
        storage.download(uuid, tmp, selector=lambda rel: not rel.startswith("code/"))
        verify_key = getattr(ckpt, "verify_key", None)
        if verify_key is not None:
            # No manifest: its model.sig (model_signing's own) is all that vouches for
            # it. code/ was not fetched, so signed files may be missing, never changed.
            signing.verify_folder(tmp, verify_key, partial=True)
        if keras2_format.determined_layout(tmp) is None:
            raise errors.ResumeError(
                f"{uuid} in {storage.url} is neither a committed checkpoint (no "
                f"{MANIFEST_NAME}) nor a Determined checkpoint folder the migration code "
                f"knows. Received: {sorted(os.listdir(tmp))}. Check "
                "searcher.source_checkpoint_uuid and the storage."
            )
        yield tmp, None


def load_weights(model: KerasModel, source: str | ChunkedFile, uuid: str) -> None:
    """The weights and optimizer state of ``source`` (a ``model.keras`` path or view) into
    ``model``; ResumeError when the optimizer state does not fit."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights_view.load_weights(model, source)  # HDF5 reads it, not zipfile
    for w in caught:
        if "Skipping variable loading for optimizer" in str(w.message):
            raise errors.ResumeError(
                f"The optimizer state in checkpoint {uuid} does not fit the model built by "
                f"build_model() ({w.message}). Use the same model and optimizer as the run "
                "that wrote the checkpoint."
            )


__all__ = ["checkpoint_folder", "load_weights"]
