"""Register checkpoints written by Determined as ckptstore checkpoints.

Recognised layouts (the files at the top of one checkpoint folder):

- ``callback``: Determined's ``DeterminedCallback`` -- ``checkpoint``, ``model_checkpoint.index``,
  ``model_checkpoint.data-*`` (TF-format weights with optimizer), ``callback_state`` (pickle:
  epoch, steps_completed, continue_id), ``metadata.json`` (``steps_completed``), ``code/``.
- ``tfkeras_trial``: ``TFKerasTrial`` -- ``determined-keras-model-weights.{index,data-*}``,
  ``determined-keras-optimizer-weights.h5``, ``rng_state.pkl``, ``determined-callbacks.v1.pkl``,
  ``workload_sequencer.pkl``, ``load_data.json``, ``metadata.json`` (``format: saved_weights``).
- ``tfkeras_h5``: older ``TFKerasTrial`` checkpoints with one ``determined-keras-model.h5``.
- ``tfkeras_h5_012``: Determined 0.12-era ``TFKerasTrial`` checkpoints: one HDF5 whole-model
  file named ``determined-keras-model`` (no extension: ``save_model(..., save_format="h5")``),
  with the optimizer's weights in its ``optimizer_weights`` group, and nothing else.

Every file is copied as is (Determined's own ``metadata.json`` is kept as
``determined_metadata.json``, since ckptstore writes ``metadata.json`` itself). Pickled files are
copied but never unpickled unless ``trust_pickle=True``: pickles run code when read.

Example::

    from ckptstore.import_determined.layouts import import_determined

    imported = import_determined("/old/det-checkpoints", storage="s3://bucket/ckpts",
                                 index=registry, trial_id=7)
    print([c.uuid for c in imported])
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import jsonfiles

if TYPE_CHECKING:
    from ckptstore.storage_backends import StorageSpec

logger = logging.getLogger(__name__)

CALLBACK = "callback"
TFKERAS_TRIAL = "tfkeras_trial"
TFKERAS_H5 = "tfkeras_h5"
TFKERAS_H5_012 = "tfkeras_h5_012"

#: The file whose presence identifies each layout.
LAYOUT_MARKERS = {
    CALLBACK: "model_checkpoint.index",
    TFKERAS_TRIAL: "determined-keras-model-weights.index",
    TFKERAS_H5: "determined-keras-model.h5",
    TFKERAS_H5_012: "determined-keras-model",
}
#: The layouts whose model is one whole-model HDF5 file (their marker).
H5_LAYOUTS = (TFKERAS_H5, TFKERAS_H5_012)
#: Files of each layout that are Python pickles.
PICKLE_FILES = (
    "callback_state",
    "rng_state.pkl",
    "determined-callbacks.v1.pkl",
    "workload_sequencer.pkl",
)
#: Name Determined's ``metadata.json`` is kept under inside the ckptstore checkpoint.
DETERMINED_METADATA_NAME = "determined_metadata.json"


@dataclasses.dataclass
class DeterminedInfo:
    """What a Determined checkpoint folder says about itself (without loading weights)."""

    path: str
    layout: str
    steps_completed: int = 0
    epoch: int | None = None
    continue_id: Any = None
    hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    experiment_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    determined_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    callback_state: dict[str, Any] | None = None
    pickles_read: list[str] = dataclasses.field(default_factory=list)
    pickles_skipped: list[str] = dataclasses.field(default_factory=list)

    def to_metadata(self) -> dict[str, Any]:
        """ckptstore checkpoint metadata for this checkpoint (JSON-safe)."""
        determined = {
            "layout": self.layout,
            "source": self.path,
            "metadata": self.determined_metadata,
            "hparams": self.hparams,
            "pickles_read": self.pickles_read,
            "pickles_skipped": self.pickles_skipped,
        }
        if self.experiment_config:
            determined["experiment_config"] = self.experiment_config
        if self.callback_state is not None:
            determined["callback_state"] = _jsonable(self.callback_state)
        metadata: dict[str, Any] = {
            "steps_completed": int(self.steps_completed),
            "determined": determined,
            "framework": "tensorflow",
        }
        if self.epoch is not None:
            metadata["epoch"] = int(self.epoch)
        if self.continue_id is not None:
            metadata["continue_id"] = _jsonable(self.continue_id)
        return metadata


@dataclasses.dataclass
class ImportedCheckpoint:
    """One Determined checkpoint registered in ckptstore."""

    uuid: str
    source: str
    layout: str
    steps_completed: int
    pickles_skipped: list[str]


def detect_layout(names: Iterable[str]) -> str | None:
    """The layout a folder with these top-level file names is in, or None."""
    names = set(names)
    for layout, marker in LAYOUT_MARKERS.items():
        if marker in names:
            return layout
    return None


def find_checkpoint_dirs(local_dir: str) -> list[str]:
    """``[local_dir]`` if it is a Determined checkpoint, else its sub-folders that are (sorted).

    Raises InvalidConfig when neither holds.
    """
    if not os.path.isdir(local_dir):
        raise errors.InvalidConfig(
            f"{local_dir!r} is not a folder; pass a Determined checkpoint folder (or a folder "
            "of them) or a storage URL."
        )
    if detect_layout(os.listdir(local_dir)):
        return [local_dir]
    found = [
        os.path.join(local_dir, name)
        for name in sorted(os.listdir(local_dir))
        if os.path.isdir(os.path.join(local_dir, name))
        and detect_layout(os.listdir(os.path.join(local_dir, name)))
    ]
    if not found:
        markers = ", ".join(sorted(LAYOUT_MARKERS.values()))
        raise errors.InvalidCheckpoint(
            f"No Determined checkpoint in {local_dir!r}: neither it nor its sub-folders hold any "
            f"of {markers}. Point at a checkpoint folder or a folder of checkpoint folders."
        )
    return found


def read_json(path: str) -> dict[str, Any]:
    """A JSON object file of a Determined checkpoint, ``{}`` when absent or not an object."""
    if not os.path.isfile(path):
        return {}
    try:
        value = jsonfiles.read_json_file(path)  # bounded size and depth: typed errors
    except OSError as exc:
        raise errors.InvalidCheckpoint(
            f"{path} is not valid JSON ({exc}); the Determined checkpoint is damaged."
        ) from None
    return value if isinstance(value, dict) else {}


def read_pickle(path: str, *, trust_pickle: bool) -> Any:
    """Unpickle ``path`` only when trusted; UnsafeCheckpointContent otherwise."""
    if not trust_pickle:
        raise errors.UnsafeCheckpointContent(
            f"{path} is a Python pickle, which can run code when read; it was not read. Pass "
            "trust_pickle=True (--trust-pickle) if you trust where this checkpoint came from."
        )
    with open(path, "rb") as f:
        return pickle.load(f)  # noqa: S301 - only with the caller's explicit trust


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(
            json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        )
    except (TypeError, ValueError):
        return str(value)


def read_determined_info(local_dir: str, *, trust_pickle: bool = False) -> DeterminedInfo:
    """Steps, epoch, continue_id and hyperparameters of one Determined checkpoint folder.

    Pickled files are skipped with a warning unless ``trust_pickle``.
    """
    names = os.listdir(local_dir)
    layout = detect_layout(names)
    if layout is None:
        raise errors.InvalidCheckpoint(
            f"{local_dir!r} is not a Determined checkpoint: none of "
            f"{', '.join(sorted(LAYOUT_MARKERS.values()))} is in it."
        )
    det_metadata = read_json(os.path.join(local_dir, "metadata.json"))
    load_data = read_json(os.path.join(local_dir, "load_data.json"))
    info = DeterminedInfo(path=local_dir, layout=layout, determined_metadata=det_metadata)
    info.steps_completed = int(det_metadata.get("steps_completed") or 0)
    info.hparams = dict(load_data.get("hparams") or det_metadata.get("hparams") or {})
    info.experiment_config = dict(
        load_data.get("experiment_config") or det_metadata.get("experiment_config") or {}
    )
    for name in PICKLE_FILES:
        path = os.path.join(local_dir, name)
        if not os.path.isfile(path):
            continue
        if not trust_pickle:
            info.pickles_skipped.append(name)
            continue
        value = read_pickle(path, trust_pickle=True)
        info.pickles_read.append(name)
        if name == "callback_state" and isinstance(value, dict):
            info.callback_state = value
            info.epoch = value.get("epoch")
            info.continue_id = value.get("continue_id")
            info.steps_completed = int(value.get("steps_completed") or info.steps_completed)
    if info.pickles_skipped:
        logger.warning(
            "Skipped reading pickled file(s) %s in %s: pickles can run code when read, so their "
            "contents (epoch, continue_id, callback and RNG state) were not imported. The files "
            "are copied unread. Pass --trust-pickle (trust_pickle=True) if you trust this "
            "checkpoint's origin.",
            ", ".join(info.pickles_skipped),
            local_dir,
        )
    return info


def _stage(local_dir: str, staging: str) -> None:
    """Link (or copy) every file of ``local_dir`` into ``staging``; Determined's metadata.json
    becomes ``determined_metadata.json``."""
    for root, dirs, files in os.walk(local_dir):
        dirs.sort()
        rel_root = os.path.relpath(root, local_dir)
        target_root = staging if rel_root == "." else os.path.join(staging, rel_root)
        os.makedirs(target_root, exist_ok=True)
        for name in files:
            target_name = name
            if rel_root == "." and name in ("metadata.json", "MANIFEST.json"):
                target_name = (
                    DETERMINED_METADATA_NAME
                    if name == "metadata.json"
                    else "determined_MANIFEST.json"
                )
            src, dst = os.path.join(root, name), os.path.join(target_root, target_name)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


def import_checkpoint_dir(
    local_dir: str, context: Any, *, trust_pickle: bool = False, source: str | None = None
) -> ImportedCheckpoint:
    """Register one local Determined checkpoint folder through a ``CheckpointContext``."""
    info = read_determined_info(local_dir, trust_pickle=trust_pickle)
    if source:
        info.path = source
    with tempfile.TemporaryDirectory(prefix="ckptstore-det-import-") as staging:
        _stage(local_dir, staging)
        uuid = context.upload(staging, info.to_metadata())
    logger.info("Imported Determined %s checkpoint %s as %s", info.layout, info.path, uuid)
    return ImportedCheckpoint(
        uuid, info.path, info.layout, info.steps_completed, info.pickles_skipped
    )


def _steps_hint(local_dir: str) -> int:
    value = read_json(os.path.join(local_dir, "metadata.json")).get("steps_completed")
    return int(value) if isinstance(value, int | float) else 0


def _is_url(source: str) -> bool:
    return "://" in source and not source.startswith("file://")


def import_determined(
    source: str,
    *,
    storage: StorageSpec | None = None,
    index: Any = None,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    trust_pickle: bool = False,
) -> list[ImportedCheckpoint]:
    """Register the Determined checkpoint(s) at ``source`` (a folder, a folder of checkpoint
    folders, or a storage URL of either) in ``storage`` and ``index`` (the registry).

    ``storage`` is a Storage, URL or config dict (default: ``CKPTSTORE_STORAGE`` / the local
    default). Returns one :class:`ImportedCheckpoint` per checkpoint, oldest steps first.
    """
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.storage_backends.spec import resolve

    context = CheckpointContext(
        resolve(storage),
        index=index,
        trial_id=trial_id,
        experiment_id=experiment_id,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="ckptstore-det-src-") as tmp:
            local = source[len("file://") :] if source.startswith("file://") else source
            if _is_url(source):
                from ckptstore.storage_backends import open_storage

                with open_storage(source) as src_storage:
                    src_storage.download("", tmp)
                local = tmp
            dirs = find_checkpoint_dirs(local)
            dirs.sort(key=lambda d: (_steps_hint(d), d))
            imported = []
            for local_dir in dirs:
                rel = os.path.relpath(local_dir, local)
                origin = (
                    source if rel == "." else source.rstrip("/") + "/" + rel.replace(os.sep, "/")
                )
                imported.append(
                    import_checkpoint_dir(
                        local_dir, context, trust_pickle=trust_pickle, source=origin
                    )
                )
            context.wait()
    finally:
        context.close()
    return imported
