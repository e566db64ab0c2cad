"""Opening a checkpoint folder in place, deduplicated or not: the folder the in-place loaders
(``load_model_from_folder``, ``det.keras.load_model_from_checkpoint_path``) read.

A deduplicated (format 2) checkpoint ``<store>/<uuid>/`` holds ``MANIFEST.json``,
``metadata.json`` and only the files stored whole (``saved_model/`` on a local store); the
content of the others is in ``<store>/.ckptstore-blobs/``. Given such a folder,
:func:`readable_folder` downloads the checkpoint from that store (its parent folder, opened as
a local storage and never left) into a temporary folder through the one verified download path
(chunk SHA-256 and file crc32c; a verify key in the environment checks the signature exactly
as ``CheckpointContext.download`` does), yields it and removes it afterwards. (The loaders first
try ``load_folder_in_place``, which reads such a folder's ``model.keras`` in place from its
chunks, without this copy.) Any other folder
(whole-file checkpoints, Determined's layouts, a plain download) is yielded as it is.

Example::

    import os
    from ckptstore.keras_io.loading._in_place import readable_folder

    with readable_folder("/mnt/ckpts/0b7c...") as folder:
        print(sorted(os.listdir(folder)))  # model.keras, metadata.json, ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid as _uuid
from collections.abc import Iterator

from ckptstore import errors
from ckptstore.checkpointing import blobs, jsonfiles, signing
from ckptstore.checkpointing import format as fmt

logger = logging.getLogger(__name__)


def is_deduplicated_folder(folder: str) -> bool:
    """Whether ``folder`` is a checkpoint folder whose manifest lists files by their chunks
    (a damaged manifest there is refused: the files it names cannot be found otherwise)."""
    path = os.path.join(folder, fmt.MANIFEST_NAME)
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        data = f.read(fmt.MAX_MANIFEST_BYTES + 1)
    if not fmt.Manifest.may_be_deduplicated(data):  # cheap: before the name is checked
        return False
    name = os.path.basename(folder)
    if not fmt.is_checkpoint_name(name):
        raise errors.InvalidCheckpoint(
            f"{folder} holds a deduplicated checkpoint's manifest but is not named by the "
            "checkpoint's UUID, so its store cannot be found; open it where it was committed "
            f"(<store>/<uuid>) or run `ckptstore checkpoint download UUID -o DIR`. "
            f"Received: {folder!r}"
        )
    return fmt.Manifest.parse(data, name).deduplicated


def _subject(folder: str) -> str | None:
    """The UUID of the checkpoint in ``folder``, as far as a folder can tell: its name when
    that is a UUID (``<store>/<uuid>``), else its manifest's (a plain download), else None
    (Determined's layouts: no subject to check)."""
    name = os.path.basename(folder)
    try:
        return str(_uuid.UUID(name)) if str(_uuid.UUID(name)) == name.lower() else None
    except ValueError:
        pass
    path = os.path.join(folder, fmt.MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        data = f.read(fmt.MAX_MANIFEST_BYTES + 1)
    manifest = jsonfiles.load_json(data, path, fmt.MAX_MANIFEST_BYTES)
    uuid = manifest.get("uuid") if isinstance(manifest, dict) else None
    return uuid if isinstance(uuid, str) else None


@contextlib.contextmanager
def readable_folder(path: str) -> Iterator[str]:
    """``path``, or for a deduplicated checkpoint folder a verified temporary download of it
    (see the module docstring), removed on exit.

    Raises:
        InvalidCheckpoint: a deduplicated folder without its store's ``.ckptstore-blobs/``
            beside it (copied out of its store), or a damaged manifest.
        ChecksumMismatch: a chunk or file whose content differs from the manifest.
        SignatureError: with a verify key set, a checkpoint its signature does not cover.
    """
    folder = os.path.abspath(path)
    if not os.path.isdir(folder) or not is_deduplicated_folder(folder):
        # Every layout (whole-file, Determined's, a plain folder) is checked before Keras or
        # the trial loader opens a file in it, exactly as a download is; a file (a `.keras`
        # path) is checked as a member of the folder holding it, so naming the file does
        # not skip the signature naming its folder would check.
        if os.path.isdir(folder):
            signing.verify(folder, subject=_subject(folder))
        elif signing.verify_key() is not None:
            parent = os.path.dirname(folder)
            signing.verify(parent, subject=_subject(parent))
        yield path
        return
    store, uuid = os.path.split(folder)
    if not os.path.isdir(os.path.join(store, blobs.BLOBS_DIR)):
        raise errors.InvalidCheckpoint(
            f"{folder} is a deduplicated checkpoint (format 2): its files' content is kept in "
            f"{os.path.join(store, blobs.BLOBS_DIR)}, which is missing (the folder was copied "
            "out of its store). Open it in its store, or get a plain folder with "
            f"`ckptstore checkpoint download {uuid} -o DIR` (or CheckpointContext.restore_path)."
            f" Received: {path!r}"
        )
    # Imported here: the context (threads, signing) is needed only for deduplicated folders.
    from ckptstore.checkpointing.context import CheckpointContext

    logger.info("%s is deduplicated; assembling its files from %s to load them", folder, store)
    with (
        CheckpointContext(store, cache=False) as ctx,
        tempfile.TemporaryDirectory(prefix=f"ckptstore-load-{uuid[:8]}-") as tmp,
    ):
        ctx.download(uuid, tmp)
        yield tmp
