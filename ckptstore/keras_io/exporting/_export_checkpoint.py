"""Adding a SavedModel to a committed checkpoint later: :func:`export_checkpoint`
(``ckptstore checkpoint export UUID``) exports the checkpoint's model in the calling process (a
Keras 2 checkpoint from a Keras 3 process: in a Keras 2 worker) and adds ``saved_model/`` to
the same checkpoint with :mod:`ckptstore.checkpointing.amend`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.keras_io.exporting._savedmodel import (
    _SUBCLASSED_HINT,
    ExportResult,
    _keras2_subclassed,
    export_keras2_folder,
    export_model_file,
)
from ckptstore.keras_io.exporting._worker import ExportWorker
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME, SAVED_MODEL_DIRNAME
from ckptstore.keras_io.saving._tf_bundle import folder_cuts

if TYPE_CHECKING:
    from ckptstore.checkpointing.format import Manifest
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import StorageSpec

logger = logging.getLogger(__name__)


def export_checkpoint(
    checkpoint_uuid: str,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    verify: bool = True,
    safe_mode: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
    modules: Sequence[str] = (),
    signing_key: str | os.PathLike[str] | None = None,
) -> ExportResult:
    """Add an inference SavedModel (``saved_model/``) to committed checkpoint
    ``checkpoint_uuid``, in this process. Downloads and verifies its ``model.keras``, exports and verifies the SavedModel (``serve``
    predicts what Keras does), then adds the files to the same checkpoint with the manifest
    rewrite of :mod:`ckptstore.checkpointing.amend` (a crash at any point leaves the checkpoint
    readable, as before or with the SavedModel). The checkpoint is pinned against GC meanwhile.
    The SavedModel is stored as the checkpoint's format and storage say: whole files a
    serving system can read in place on a local or ``shared_fs`` store (deduplicated or not:
    :func:`~ckptstore.checkpointing.format.kept_whole_in_place`) and in a ``dedup=False``
    checkpoint; chunks cut at its tensors in a deduplicated checkpoint on an object store
    (the returned ``path`` is then its logical place, fetch it with ``ckptstore checkpoint
    download UUID --selector 'saved_model/**'``).

    Args:
        checkpoint_uuid: the checkpoint (registry row, else looked for in storage).
        storage: as for :func:`ckptstore.load_checkpoint_model`.
        registry: as for :func:`ckptstore.load_checkpoint_model`.
        verify: compare ``serve`` with the Keras model's predictions.
        safe_mode: as for ``keras.saving.load_model``.
        custom_objects: as for ``keras.saving.load_model``.
        modules: modules defining the model's custom layers that may be imported (an
            allow-list, with their sub-modules); the checkpoint's own config never chooses
            what is imported (:mod:`ckptstore.keras_io.saving._code_refs`).
        signing_key: for a *signed* checkpoint (``model.sig``): the EC private key (PEM
            file; default ``$CKPTSTORE_SIGNING_KEY``) that signs it again over its files and
            the SavedModel. The old signature must verify with this key's public half (the
            signer vouches only for what it had signed: its digests, and the model file
            the export reads, checked against them). Without a key the export of a signed
            checkpoint is refused (``InvalidConfig``): ``saved_model/`` outside the signature
            would make every verifying reader refuse the checkpoint. An unsigned checkpoint
            stays unsigned (sign it with ``ckptstore checkpoint sign``).

    Raises:
        CheckpointNotFound: no such checkpoint.
        CheckpointConflict: it already has a SavedModel.
        InvalidConfig: it is signed and no signing key was given.
        SignatureError: its signature does not verify with the signing key's public half.
        ExportError: the export or its check failed.
        ChecksumMismatch: a downloaded file differs from the manifest.
        UntrustedCode: the config names code not allowed (nothing was imported).

    Example::

        from ckptstore.keras_io.exporting import export_checkpoint
        export_checkpoint("0b7c...", storage="s3://bucket/ckpts")
    """
    from ckptstore.checkpointing import amend
    from ckptstore.checkpointing import format as fmt

    with _checkpoint_context(checkpoint_uuid, storage, registry) as ckpt:
        manifest = fmt.load_manifest(ckpt.storage, checkpoint_uuid)
        prefix = SAVED_MODEL_DIRNAME + "/"
        if any(rel.startswith(prefix) for rel in manifest.files):
            raise errors.CheckpointConflict(
                f"Checkpoint {checkpoint_uuid} already has a {SAVED_MODEL_DIRNAME}/; nothing to "
                "do. To export again, delete it first: ckptstore checkpoint delete "
                f"{checkpoint_uuid} --glob '{SAVED_MODEL_DIRNAME}/*'"
            )
        keras2, selector = _model_files(checkpoint_uuid, manifest.files)
        resign = _resign_key(checkpoint_uuid, manifest, signing_key)
        keys = tempfile.TemporaryDirectory(prefix="ckptstore-export-key-")
        if resign is not None:  # the restore checks the old signature with the signer's key
            ckpt.verify_key = signing.public_key_file(resign, keys.name)
        with keys, ckpt.restore_path(checkpoint_uuid, selector=selector) as path:
            staging = tempfile.mkdtemp(prefix=f"ckptstore-export-{checkpoint_uuid[:8]}-")
            try:
                out = os.path.join(staging, SAVED_MODEL_DIRNAME)
                if keras2:
                    result = _export_keras2_checkpoint(
                        path,
                        out,
                        verify=verify,
                        safe_mode=safe_mode,
                        custom_objects=custom_objects,
                        modules=modules,
                    )
                else:
                    result = export_model_file(
                        os.path.join(path, MODEL_FILENAME),
                        out,
                        modules=modules,
                        verify=verify,
                        safe_mode=safe_mode,
                        custom_objects=custom_objects,
                    )
                cuts = folder_cuts(staging)
                if resign is not None:
                    _sign_again(path, staging, resign, ckpt.verify_key, checkpoint_uuid)
                # A deduplicated checkpoint on an object store gets the SavedModel as chunks
                # cut at its tensors, like the exports written at save time; a local store or
                # a whole-file checkpoint, whole files in place.
                amend.add_files(
                    ckpt.storage,
                    checkpoint_uuid,
                    staging,
                    index=ckpt.index,
                    storage_url=ckpt.storage_url,
                    cuts=cuts,
                    replace=(signing.SIGNATURE_NAME,),
                )
            finally:
                import shutil

                shutil.rmtree(staging, ignore_errors=True)
    result.path = f"{ckpt.storage_url.rstrip('/')}/{checkpoint_uuid}/{SAVED_MODEL_DIRNAME}"
    logger.info("Added a SavedModel to checkpoint %s in %.1f s", checkpoint_uuid, result.seconds)
    return result


def _resign_key(
    uuid: str, manifest: Manifest, signing_key: str | os.PathLike[str] | None
) -> str | None:
    """The key that signs the checkpoint again after the export (None: it is unsigned);
    InvalidConfig when it is signed and no key was given."""
    if signing.SIGNATURE_NAME not in manifest.files:
        return None
    key = signing.key_from(signing_key, signing.SIGNING_KEY_ENV)
    if key is None:
        raise errors.InvalidConfig(
            f"Checkpoint {uuid} is signed ({signing.SIGNATURE_NAME}); saved_model/ would be "
            "outside its signature and every reader with a verify key would refuse the "
            "checkpoint. Pass the signing key to sign it again (--key KEY.pem, signing_key=, "
            f"or {signing.SIGNING_KEY_ENV}). Received: no signing key."
        )
    return key


def _sign_again(path: str, staging: str, key: str, public_key: str | None, uuid: str) -> None:
    """Write ``staging/model.sig``: the old signature's digests (checked with ``public_key``
    by the restore of ``path``) plus the SHA-256 of the new files in ``staging``."""
    assert public_key is not None  # set by export_checkpoint before the restore
    expected = signing.Expected.read(os.path.join(path, signing.SIGNATURE_NAME), public_key)
    if expected.algorithm != signing.HASH_ALGORITHM:
        raise errors.SignatureError(
            f"Checkpoint {uuid} was signed with {expected.algorithm} digests; ckptstore signs "
            "SHA-256 ones and cannot extend that signature. Delete its model.sig, export, then "
            f"`ckptstore checkpoint sign {uuid}`. Received: {expected.algorithm}."
        )
    digests = {**expected.digests, **signing.folder_digests(staging)}
    signing.sign_digests(digests, key, os.path.join(staging, signing.SIGNATURE_NAME), name=uuid)


def _model_files(checkpoint_uuid: str, files: Mapping[str, Any]) -> tuple[bool, str | list[str]]:
    """Whether the checkpoint is a Keras 2 one, and the selector of the files its export needs;
    ModelLoadError when it holds no model that can be exported."""
    from ckptstore.keras_io.saving import _keras2_format as keras2_format

    keras2 = MODEL_FILENAME not in files and keras2_format.WEIGHTS_PREFIX + ".index" in files
    if keras2 and keras2_format.MODEL_CONFIG_FILENAME not in files:
        raise errors.ModelLoadError(
            f"Keras 2 checkpoint {checkpoint_uuid} has no "
            f"{keras2_format.MODEL_CONFIG_FILENAME} (a subclassed model), so its model "
            "cannot be rebuilt to export it. Build the model in code under Keras 2, "
            f"model.load_weights(<checkpoint>/{keras2_format.WEIGHTS_PREFIX}) and "
            "model.save(path, save_format='tf')."
        )
    if not keras2 and MODEL_FILENAME not in files:
        raise errors.ModelLoadError(
            f"Checkpoint {checkpoint_uuid} has no {MODEL_FILENAME} to export (files: "
            f"{sorted(files)[:10]}); only checkpoints written by "
            "DeterminedCallback / TFKerasTrial can be exported."
        )
    if keras2:
        return True, [keras2_format.WEIGHTS_PREFIX + ".*", keras2_format.MODEL_CONFIG_FILENAME]
    return False, MODEL_FILENAME


def _keras2_here() -> bool:
    """Whether ``tf.keras`` is (or, TensorFlow's Keras not chosen yet, will be) Keras 2 in this
    process — :func:`ckptstore.keras_io.backend.legacy_keras_requested` without importing a
    Keras."""
    backend = sys.modules.get("ckptstore.keras_io.backend")
    if backend is not None:
        return bool(backend.IS_KERAS2)
    tf = sys.modules.get("tensorflow")
    loader = getattr(tf, "__dict__", {}).get("keras") if tf is not None else None
    if loader is not None and getattr(loader, "_tfll_initialized", False):
        return getattr(loader, "_tfll_keras_version", None) == "tf_keras"
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")


def _export_keras2_checkpoint(
    path: str,
    out: str,
    *,
    verify: bool,
    safe_mode: bool,
    custom_objects: Mapping[str, Any] | None,
    modules: Sequence[str],
) -> ExportResult:
    """Export a downloaded Keras 2 checkpoint folder: in this process when it runs Keras 2,
    else in a Keras 2 :class:`ExportWorker` (a Keras 3 process cannot rebuild tf_keras
    models; nor does the ``ckptstore`` command import TensorFlow)."""
    from ckptstore.keras_io.saving import _keras2_format as keras2_format

    with open(os.path.join(path, keras2_format.MODEL_CONFIG_FILENAME), encoding="utf-8") as f:
        config_json = f.read()
    if _keras2_subclassed(config_json):
        raise errors.ModelLoadError(_SUBCLASSED_HINT.format(what=f"Keras 2 checkpoint {path}"))
    if _keras2_here():
        return export_keras2_folder(
            path,
            out,
            verify=verify,
            modules=modules,
            safe_mode=safe_mode,
            custom_objects=custom_objects,
        )
    if custom_objects:
        raise errors.ExportError(
            "custom_objects cannot be handed to the Keras 2 process that exports a Keras 2 "
            "checkpoint from this Keras 3 process: call export_checkpoint() in a process with "
            "TF_USE_LEGACY_KERAS=1, or make the custom layers' modules importable (PYTHONPATH) "
            "and registered (tf.keras.saving.register_keras_serializable)."
        )
    worker = ExportWorker(nice=0, keras2=True)
    try:
        return worker.export_keras2(
            path, out, modules=list(modules), verify=verify, safe_mode=safe_mode
        )
    finally:
        worker.close()


@contextlib.contextmanager
def _checkpoint_context(
    uuid: str, storage: StorageSpec | None, registry: Registry
) -> Iterator[Any]:
    """A CheckpointContext on the storage holding ``uuid``, indexed by the registry."""
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.keras_io.loading._loaders import registry_and_storage, resolve_checkpoint

    with registry_and_storage(storage, registry) as (reg, storage_for):
        found, url = resolve_checkpoint(reg, storage_for, None, uuid)
        store = storage_for(url)
        ckpt = CheckpointContext(store, index=reg, storage_url=url or store.url)
        try:
            yield ckpt
        finally:
            ckpt.close()


def checkpoint_main(args: Any) -> int:
    """``python -m ckptstore.keras_io.exporting checkpoint UUID``: what ``ckptstore checkpoint
    export`` runs (the command itself never imports TensorFlow). Prints one JSON line: the
    result, or ``{"error": class name, "message": ...}`` with exit code 1."""
    try:
        result = export_checkpoint(
            args.uuid,
            storage=args.storage,
            registry=args.registry,
            verify=not args.no_verify,
            safe_mode=not args.unsafe_deserialization,
            modules=args.module or (),
        )
    except errors.CkptstoreError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    print(json.dumps(result.to_json()), flush=True)
    return 0
