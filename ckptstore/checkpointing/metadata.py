"""A checkpoint's ``metadata.json``: what a commit writes (:func:`build_metadata`: the caller's
keys plus ckptstore's own fields, bounded to :data:`MAX_METADATA_BYTES`) and what every reader
gets back (:func:`read_metadata`, checked and typed errors).

The folder layout and the manifest are :mod:`ckptstore.checkpointing.format`; this module
owns only the metadata file.

Example::

    from ckptstore.checkpointing import metadata as ckpt_metadata

    built = ckpt_metadata.build_metadata(uuid, {"steps_completed": 10})
    assert ckpt_metadata.read_metadata(storage, uuid)["steps_completed"] == 10
"""

from __future__ import annotations

import datetime as _dt
import logging
import platform
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.format import (
    FORMAT_VERSION,
    METADATA_NAME,
    check_storage_id,
    dump_json,
)
from ckptstore.checkpointing.jsonfiles import load_json
from ckptstore.jsonsafe import to_json
from ckptstore.validators import int_at_least

if TYPE_CHECKING:
    from ckptstore.storage_backends.base import Storage

logger = logging.getLogger(__name__)

#: The largest ``metadata.json`` ckptstore writes or reads (1 MiB). Metadata is copied into
#: the registry and read on every listing; keep big things in checkpoint files instead.
MAX_METADATA_BYTES = 2**20


def read_metadata(storage: Storage, uuid: str) -> dict[str, Any]:
    """The parsed ``metadata.json`` of checkpoint ``uuid``; InvalidCheckpoint if missing/bad."""
    check_storage_id(uuid)
    where = f"{uuid}/{METADATA_NAME}"
    try:
        data = storage.read_bytes(where)
    except errors.StorageNotFound:
        raise errors.InvalidCheckpoint(
            f"{where} does not exist in {storage.url}; the checkpoint is incomplete."
        ) from None
    try:
        metadata = to_json(load_json(data, where, MAX_METADATA_BYTES), what=where)
    except errors.InvalidConfig as exc:
        raise errors.InvalidCheckpoint(str(exc)) from None
    if not isinstance(metadata, dict):
        raise errors.InvalidCheckpoint(f"{where} is not a JSON object.")
    steps = metadata.get("steps_completed")
    if steps is not None:
        int_at_least(f"{where}: steps_completed", steps, 0, error=errors.InvalidCheckpoint)
    return metadata


def parse_created_at(value: Any) -> _dt.datetime | None:
    """``created_at`` from metadata as an aware UTC datetime (None if absent or bad)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return parsed


def framework_versions() -> dict[str, str]:
    """Python, and TensorFlow/Keras versions if they are already imported (never imports them)."""
    versions = {"python": platform.python_version()}
    for name in ("tensorflow", "keras", "tf_keras"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if isinstance(version, str):
            versions[name] = version
    return versions


def utc_now_iso() -> str:
    """The current UTC time in ISO 8601 with microseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def build_metadata(
    uuid: str,
    user_metadata: Mapping[str, Any] | None,
    *,
    trial_id: int | None = None,
    experiment_id: int | None = None,
) -> dict[str, Any]:
    """The full ``metadata.json`` content: the caller's keys plus ckptstore's own fields.

    ``steps_completed``, ``continue_id``, ``epoch``, ``metrics``, ``trial_id`` and
    ``experiment_id`` come from ``user_metadata`` when it has them.
    """
    from ckptstore import __version__

    if user_metadata is not None and not isinstance(user_metadata, Mapping):
        raise errors.InvalidConfig(
            "Checkpoint metadata must be a dict of JSON-serializable values. Received: "
            f"{type(user_metadata).__name__}"
        )
    # The one JSON policy (NaN/inf -> null, str keys, bounded depth) before anything else.
    user = dict(to_json(dict(user_metadata or {}), what="checkpoint metadata"))
    if "steps_completed" in user:
        int_at_least("steps_completed", user["steps_completed"], 0)
    for key in ("uuid", "format_version", "ckptstore_version", "created_at"):
        if key in user:
            logger.warning("Ignoring metadata key %r: ckptstore sets it.", key)
            user.pop(key)
    metadata: dict[str, Any] = dict(user)
    metadata.update(
        uuid=uuid,
        trial_id=user.get("trial_id", trial_id),
        experiment_id=user.get("experiment_id", experiment_id),
        continue_id=user.get("continue_id"),
        steps_completed=user.get("steps_completed", 0),
        epoch=user.get("epoch"),
        metrics=user.get("metrics") or {},
        format_version=FORMAT_VERSION,
        framework_versions=framework_versions(),
        ckptstore_version=__version__,
        created_at=utc_now_iso(),
    )
    try:
        size = len(dump_json(metadata))
    except (TypeError, ValueError) as exc:
        raise errors.InvalidConfig(
            f"Checkpoint metadata must be JSON-serializable ({exc}); convert values such as "
            "numpy scalars with float()/int() first."
        ) from None
    if size > MAX_METADATA_BYTES:
        raise errors.InvalidConfig(
            f"Checkpoint metadata is {size} bytes as JSON, over the limit of "
            f"{MAX_METADATA_BYTES} bytes (MAX_METADATA_BYTES); save large data as a file in "
            "the checkpoint folder instead."
        )
    return metadata
