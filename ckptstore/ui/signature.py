"""The slot for a checkpoint's signature status on its page.

Signing lives in ``ckptstore.signing`` (another part of the project). Until that module exists
and offers ``checkpoint_signature_status(storage, uuid) -> {"state", "message"}``, the page
shows nothing about signatures rather than a status nobody checked.

Example::

    status = signature_status(storage, uuid)   # None: nothing to show
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: The function of ``ckptstore.signing`` the page asks (see the module docstring).
STATUS_FUNCTION = "checkpoint_signature_status"


def signature_status(storage: Storage, uuid: str) -> dict[str, Any] | None:
    """``{"state": ..., "message": ...}`` from ``ckptstore.signing``, or None when signing is
    not available (the page then has no signature row)."""
    try:
        signing = importlib.import_module("ckptstore.signing")
    except ImportError:
        return None
    status = getattr(signing, STATUS_FUNCTION, None)
    if status is None:
        return None
    try:
        return dict(status(storage, uuid))
    except Exception as exc:  # noqa: BLE001 - the page says the check failed, and why
        logger.warning("Signature status of %s could not be read: %s", uuid, exc)
        return {"state": "UNKNOWN", "message": f"the signature could not be checked: {exc}"}
