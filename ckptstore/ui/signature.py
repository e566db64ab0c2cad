"""A checkpoint's signature status on its page (:mod:`ckptstore.checkpointing.signing`).

What a page view can afford: it reads the checkpoint's manifest and, when there is one, its
``model.sig`` (a few KB), never the checkpoint's files. So the states are

- ``UNSIGNED``: the manifest lists no ``model.sig``;
- ``SIGNED``: there is one, and no verify key is configured for the UI (``CKPTSTORE_VERIFY_KEY``);
- ``VERIFIED``: the signature checks out against that key (the files it vouches for are
  checked against their digests on every verified download: ``ckptstore checkpoint verify``);
- ``INVALID``: it does not (another key, or an altered signature file).

Example::

    status = signature_status(storage, uuid, manifest)   # {"state": ..., "message": ...}
"""

from __future__ import annotations

import os
import tempfile

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.checkpointing.format import Manifest
from ckptstore.storage_backends.base import Storage


def signature_status(storage: Storage, uuid: str, manifest: Manifest) -> dict[str, str]:
    """``{"state": ..., "message": ...}`` for checkpoint ``uuid`` (see the module doc)."""
    if signing.SIGNATURE_NAME not in manifest.files:
        return {"state": "UNSIGNED", "message": f"no {signing.SIGNATURE_NAME} in the checkpoint"}
    try:
        key = signing.verify_key()
    except errors.CkptstoreError as exc:  # a key file that is gone: say so on the page
        return {"state": "SIGNED", "message": f"not checked: {exc}"}
    if key is None:
        return {
            "state": "SIGNED",
            "message": f"not checked here: set {signing.VERIFY_KEY_ENV} for the UI, or run "
            f"`ckptstore checkpoint verify {uuid} --key KEY.pem`",
        }
    with tempfile.TemporaryDirectory(prefix="ckptstore-ui-sig-") as tmp:
        path = os.path.join(tmp, signing.SIGNATURE_NAME)
        try:
            with open(path, "wb") as f:
                f.write(storage.read_bytes(f"{uuid}/{signing.SIGNATURE_NAME}"))
            signing.signed_digests(path, key)
        except errors.CkptstoreError as exc:
            return {"state": "INVALID", "message": str(exc)}
    return {
        "state": "VERIFIED",
        "message": f"signed by the key in {signing.VERIFY_KEY_ENV}; the files are checked "
        "against it on every verified download",
    }
