"""Load Keras models from checkpoints: from a local folder, or by trial / UUID from storage.

A checkpoint written by ``DeterminedCallback`` holds ``model.keras`` (architecture, weights,
optimizer state) and, for the final checkpoint, an inference SavedModel in ``saved_model/``.
:func:`load_model_from_folder` prefers the ``.keras`` file and falls back to the
SavedModel (inference only). :func:`load_checkpoint_model` finds the checkpoint through the
registry (or by scanning storage when the registry does not know it) and reads its ``.keras`` file
alone, verified: in place on a local store (a deduplicated one from its chunk files), else a
download into a temporary folder (the restore cache serves repeated loads); the model is built
from its config and its weights read by HDF5 where they are (:mod:`._archive`).

Example::

    import ckptstore

    model = ckptstore.load_checkpoint_model(trial_id=3)                   # latest of trial 3
    model = ckptstore.load_checkpoint_model(trial_id=3, best_by="val_loss")
    model = ckptstore.load_checkpoint_model(checkpoint_uuid="0b7c...", storage="s3://b/ckpts")
    predictions = model.predict(x)
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptstore import errors
from ckptstore.checkpointing.blobs import BLOBS_DIR
from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.loading._archive import load_archive
from ckptstore.keras_io.loading._in_place import is_deduplicated_folder, readable_folder
from ckptstore.keras_io.loading._into_model import load_into_model
from ckptstore.keras_io.saving import _keras2_format as keras2_format
from ckptstore.keras_io.saving._snapshot import MODEL_FILENAME, SAVED_MODEL_DIRNAME

if TYPE_CHECKING:
    from ckptstore.registry import Registry
    from ckptstore.storage_backends import Storage, StorageSpec

logger = logging.getLogger(__name__)

#: The SavedModel endpoint ``model.export()`` writes.
SERVE_ENDPOINT = "serve"


# ---- local folder --------------------------------------------------------------------------------
def _find_keras_file(path: str) -> str | None:
    if os.path.isfile(path) and path.endswith(".keras"):
        return path
    preferred = os.path.join(path, MODEL_FILENAME)
    if os.path.isfile(preferred):
        return preferred
    candidates = sorted(n for n in os.listdir(path) if n.endswith(".keras"))
    if len(candidates) == 1:
        return os.path.join(path, candidates[0])
    if len(candidates) > 1:
        raise errors.ModelLoadError(
            f"Checkpoint folder {path} holds several .keras files {candidates} and no "
            f"{MODEL_FILENAME}; pass the path of the one to load."
        )
    return None


def _find_saved_model(path: str) -> str | None:
    for candidate in (os.path.join(path, SAVED_MODEL_DIRNAME), path):
        if os.path.isfile(os.path.join(candidate, "saved_model.pb")):
            return candidate
    return None


class SavedModelPredictor:
    """Inference-only wrapper of a SavedModel with several inputs (``predict`` and ``__call__``).

    Example::

        predictor = SavedModelPredictor("ckpt/saved_model")
        y = predictor.predict({"a": xa, "b": xb})
    """

    def __init__(self, path: str, endpoint: str = SERVE_ENDPOINT) -> None:
        import tensorflow as tf

        self.path = path
        self._loaded = tf.saved_model.load(path)
        if hasattr(self._loaded, endpoint):
            self._fn = getattr(self._loaded, endpoint)
        else:  # a signature (Keras 2 SavedModels): one output dict; keep it a plain array
            signature = self._loaded.signatures[endpoint]
            self._fn = lambda inputs: _single(signature(**_as_signature_input(signature, inputs)))

    def __call__(self, inputs: Any) -> Any:
        return self._fn(inputs)

    def predict(self, x: Any, batch_size: int = 32, verbose: Any = 0, **_: Any) -> Any:
        """Run the endpoint over ``x`` in batches; returns NumPy arrays."""
        import numpy as np
        import tensorflow as tf

        first = next(iter(x.values())) if isinstance(x, Mapping) else x
        n = len(first)
        outputs = []
        for start in range(0, n, batch_size):
            if isinstance(x, Mapping):
                batch = {k: v[start : start + batch_size] for k, v in x.items()}
            else:
                batch = x[start : start + batch_size]
            outputs.append(tf.nest.map_structure(lambda t: t.numpy(), self._fn(batch)))
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *outputs)


def _as_signature_input(signature: Any, inputs: Any) -> dict[str, Any]:
    import tensorflow as tf

    if isinstance(inputs, Mapping):
        return {k: tf.convert_to_tensor(v) for k, v in inputs.items()}
    _, kwargs = signature.structured_input_signature
    (name, spec), *rest = kwargs.items()
    if rest:
        raise errors.ModelLoadError(
            f"This SavedModel takes several inputs {sorted(kwargs)}; pass a dict of them."
        )
    return {name: tf.convert_to_tensor(inputs, dtype=spec.dtype)}


def _single(outputs: Any) -> Any:
    if isinstance(outputs, Mapping) and len(outputs) == 1:
        return next(iter(outputs.values()))
    return outputs


def _load_saved_model(path: str) -> KerasModel | SavedModelPredictor:
    import keras
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    signature = loaded.signatures.get("serving_default")
    if not hasattr(loaded, SERVE_ENDPOINT):
        # A Keras 2 SavedModel (model.save(save_format="tf")) has only its signature.
        return SavedModelPredictor(path, endpoint="serving_default")
    if signature is not None:
        _, kwargs = signature.structured_input_signature
        if len(kwargs) == 1:
            spec = next(iter(kwargs.values()))
            inputs = keras.Input(shape=tuple(spec.shape[1:]), dtype=spec.dtype.name)
            layer = keras.layers.TFSMLayer(path, call_endpoint=SERVE_ENDPOINT)
            return keras.Model(inputs, layer(inputs), name="saved_model_inference")
    return SavedModelPredictor(path)


def load_model_from_folder(
    path: str,
    compile: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    modules: Sequence[str] = (),
) -> KerasModel | SavedModelPredictor:
    """A Keras model from a local checkpoint folder (or a ``.keras`` file).

    A deduplicated checkpoint's folder in its store (``<store>/<uuid>``, chunks in
    ``<store>/.ckptstore-blobs/``) is read too: its ``model.keras`` in place from its chunk
    files, verified first (:func:`load_folder_in_place`); a checkpoint without one has its
    files assembled, verified, into a temporary folder removed after the load
    (:mod:`._in_place`).

    Loads ``model.keras`` (or the folder's only ``*.keras``) with its optimizer state. When there
    is none, falls back to the inference SavedModel in ``saved_model/`` (or ``path`` itself),
    wrapped as a ``keras.Model`` around ``keras.layers.TFSMLayer`` (a :class:`SavedModelPredictor`
    when it has several inputs): good for ``predict()``, not for training.

    Raises:
        ModelLoadError: no model files, unknown custom objects (pass ``custom_objects``), or an
            unreadable file.
        InvalidCheckpoint: a deduplicated folder copied out of its store (no blob store
            beside it).
        UnsafeCheckpointContent: a Lambda layer under ``safe_mode=True``.
        UntrustedCode: the model config names a module the caller did not allow with
            ``modules=`` (nor hand over with ``custom_objects=``); nothing was imported.

    ``modules``: modules defining custom layers that may be imported (an allow-list, with their
    sub-modules); a checkpoint's own config never chooses what is imported.

    Example::

        model = load_model_from_folder("/tmp/ckpt", compile=False)
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise errors.ModelLoadError(
            f"Checkpoint path {path} does not exist; download the checkpoint first "
            "(CheckpointContext.download) or use ckptstore.load_checkpoint_model()."
        )
    options = {"compile": compile, "custom_objects": custom_objects, "safe_mode": safe_mode}
    loaded = load_folder_in_place(path, modules=modules, **options)
    if loaded is not None:
        return loaded
    with readable_folder(path) as folder:
        return _load_folder(folder, compile, custom_objects, safe_mode, modules)


def load_folder_in_place(
    path: str, *, unless: Sequence[str] = (), **options: Any
) -> KerasModel | None:
    """The model of deduplicated checkpoint folder ``path`` in its store, its ``.keras`` file
    read in place from the chunk files (verified first, as a load by UUID reads it: no
    reassembled copy, no other file); None when ``path`` is no such folder, its manifest lists
    no ``.keras`` file, or lists any of ``unless`` (a layout read otherwise). ``options``: as
    :func:`.load_archive` takes them."""
    from ckptstore.checkpointing import CheckpointContext

    folder = os.path.abspath(path)
    if not os.path.isdir(folder) or not is_deduplicated_folder(folder):
        return None
    store, uuid = os.path.split(folder)
    if not os.path.isdir(os.path.join(store, BLOBS_DIR)):
        return None  # readable_folder says what is wrong
    with CheckpointContext(store, cache=False) as ctx:
        if any(name in ctx._manifest(uuid).files for name in unless):
            return None
        return _load_archive_of(ctx, uuid, **options)


def _load_folder(
    path: str,
    compile: bool,
    custom_objects: Mapping[str, Any] | None,
    safe_mode: bool,
    modules: Sequence[str],
) -> KerasModel | SavedModelPredictor:
    """:func:`load_model_from_folder` on a folder holding the checkpoint's files."""
    keras_file = _find_keras_file(path)
    if keras_file is None and os.path.isdir(path) and keras2_format.has_weights(path):
        from ckptstore.keras_io import backend

        if backend.IS_KERAS2:
            logger.info("Loading Keras 2 model from %s", path)
            return keras2_format.load_model(
                path,
                compile=compile,
                custom_objects=custom_objects,
                safe_mode=safe_mode,
                modules=modules,
            )
        # Keras 3 cannot rebuild a Keras 2 model from its config: the SavedModel serves
        # predictions; ckptstore.keras.load_determined_checkpoint loads the weights into a
        # Keras 3 model built in code.
    if keras_file is not None:
        logger.info("Loading Keras model from %s", keras_file)
        return load_archive(
            keras_file,
            compile=compile,
            custom_objects=custom_objects,
            safe_mode=safe_mode,
            modules=modules,
        )
    saved_model = _find_saved_model(path)
    if saved_model is not None:
        logger.info(
            "No .keras file in %s; loading the SavedModel %s for inference", path, saved_model
        )
        return _load_saved_model(saved_model)
    raise errors.ModelLoadError(
        f"Checkpoint folder {path} has no model: expected {MODEL_FILENAME} (or one *.keras file) "
        f"or an inference SavedModel in {SAVED_MODEL_DIRNAME}/saved_model.pb. Found: "
        f"{sorted(os.listdir(path)) if os.path.isdir(path) else path}."
    )


# ---- by trial / uuid -----------------------------------------------------------------------------
def _scan_trial(
    storage: Storage, trial_id: int, best_by: str | None, smaller_is_better: bool
) -> str:
    """Find a trial's latest/best checkpoint from storage alone (no registry row)."""
    from ckptstore.checkpointing.metrics import rank_by_metric
    from ckptstore.checkpointing.scan import scan_checkpoints, sort_records

    records = [r for r in scan_checkpoints(storage) if r.trial_id == trial_id]
    if not records:
        raise errors.TrialNotFound(
            f"Trial {trial_id} is not in the registry and {storage.url} holds no checkpoint of "
            "it. Check the trial id, or pass the registry=/storage= it was trained with."
        )
    if best_by is None:
        return max(records, key=lambda r: (r.steps_completed, r.created_at or 0)).uuid
    ranked = rank_by_metric(sort_records(records), best_by, smaller_is_better)
    if not ranked:
        raise errors.CheckpointNotFound(
            f"No checkpoint of trial {trial_id} in {storage.url} has the metric {best_by!r}; "
            "use a metric the trial reported with its checkpoints, or drop best_by."
        )
    return ranked[0].uuid


def resolve_checkpoint(
    registry: Registry,
    storage: StorageSpec | None,
    trial_id: int | None,
    checkpoint_uuid: str | None,
    best_by: str | None = None,
    smaller_is_better: bool = True,
) -> tuple[str, str | None]:
    """``(uuid, storage_url or None)`` of the checkpoint to load (see :func:`load_checkpoint_model`)."""
    from ckptstore.checkpointing.format import is_committed
    from ckptstore.checkpointing.metrics import rank_by_metric
    from ckptstore.checkpointing.reconcile import newest_in_storage
    from ckptstore.checkpointing.scan import sort_records

    if (trial_id is None) == (checkpoint_uuid is None):
        raise errors.InvalidConfig(
            "Pass exactly one of trial_id= (its latest or best checkpoint) or checkpoint_uuid=. "
            f"Received: trial_id={trial_id!r}, checkpoint_uuid={checkpoint_uuid!r}."
        )
    if checkpoint_uuid is not None:
        try:
            row = registry.get_checkpoint(checkpoint_uuid)
            if row.state in ("COMMITTED", "PARTIALLY_DELETED"):
                return row.uuid, row.storage_url or None
        except errors.CheckpointNotFound:
            pass
        if storage is not None and is_committed(storage(), checkpoint_uuid):
            return checkpoint_uuid, None
        raise errors.CheckpointNotFound(
            f"No committed checkpoint {checkpoint_uuid!r} in the registry or in storage; check "
            "the UUID (`ckptstore checkpoint list`) and the storage=/registry= arguments."
        )
    assert trial_id is not None
    try:
        registry.get_trial(trial_id)
    except errors.TrialNotFound:
        return _scan_trial(storage(), trial_id, best_by, smaller_is_better), None
    records = sort_records(registry.checkpoint_records(trial_id=trial_id))
    if best_by is None:
        candidates = list(reversed(records))
    else:
        candidates = rank_by_metric(records, best_by, smaller_is_better)
    row = None
    if candidates:
        # A row whose manifest is gone is skipped (logged): the next newest/best that exists.
        recorded = candidates[0].storage_url or None
        row = newest_in_storage(
            storage(recorded), candidates, storage_url=recorded, trial_id=trial_id
        )
    if row is None:
        what = "checkpoint" if best_by is None else f"checkpoint with the metric {best_by!r}"
        raise errors.CheckpointNotFound(
            f"Trial {trial_id} has no committed {what} yet; train it (with a checkpointing "
            "callback) first, or load by checkpoint_uuid=."
        )
    return row.uuid, row.storage_url or None


def load_checkpoint_model(
    trial_id: int | None = None,
    checkpoint_uuid: str | None = None,
    *,
    storage: StorageSpec | None = None,
    registry: Registry | str | None = None,
    best_by: str | None = None,
    smaller_is_better: bool = True,
    compile: bool = True,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    cache: bool | None = None,
    modules: Sequence[str] = (),
    verify_key: str | os.PathLike[str] | None = None,
    model: KerasModel | Callable[[], KerasModel] | None = None,
) -> KerasModel | SavedModelPredictor:
    """Download, verify and load the model of a checkpoint.

    Args:
        trial_id: load this trial's latest checkpoint (or its best by ``best_by``).
        checkpoint_uuid: load this checkpoint. Pass exactly one of the two.
        storage: where the checkpoint lives (URL, dict or Storage). Default:
            ``CKPTSTORE_STORAGE`` / the default folder; the storage URL the registry recorded
            for the checkpoint is used when it is under that storage, an allowed prefix of
            ``CKPTSTORE_ALLOWED_STORAGE`` (comma-separated; ``*`` = any but HTTP), or an
            S3/GCS/Azure bucket (read with your own credentials and endpoint settings), else
            :class:`~ckptstore.errors.StorageNotAllowed`: a row never sends this process to
            a local path, a host or a scheme it was not given (docs/how-to/trust.md).
        registry: a Registry or URL; default ``CKPTSTORE_REGISTRY`` / the default SQLite file.
            A trial or UUID the registry does not know is looked for in storage.
        best_by: a validation metric name; picks the trial's best checkpoint by it.
        smaller_is_better: direction of ``best_by``.
        compile: as for ``keras.saving.load_model``.
        custom_objects: as for ``keras.saving.load_model``.
        safe_mode: as for ``keras.saving.load_model`` (refuses Lambda layers).
        cache: take bytes this machine already loaded from the local restore cache
            (``ckptstore.checkpointing.cache``). None (default): on for remote storage unless
            ``CKPTSTORE_CACHE=off``; False fetches everything from storage.
        modules: modules defining custom layers that may be imported (an allow-list); the
            checkpoint's own config never chooses what is imported.
        verify_key: a PEM file with the trusted EC public key (default
            ``CKPTSTORE_VERIFY_KEY``): an unsigned or altered checkpoint is refused before
            Keras reads it (:mod:`ckptstore.checkpointing.signing`).
        model: a model built in code (or a function with no arguments returning one) to load
            the checkpoint's weights, and its optimizer state when it is compiled, into: for
            any checkpoint of either Keras version, including weights-only ones (a model
            whose config could not be saved, a Keras 2 subclassed model). It is returned.
            The model must have the checkpoint's layers and shapes (build it first when it
            is subclassed); nothing the checkpoint names is imported.

    Raises:
        TrialNotFound: the registry has no such trial.
        CheckpointNotFound: no such checkpoint, or the trial has none.
        ChecksumMismatch: a downloaded file differs from the manifest.
        ModelLoadError: the files hold no loadable model (a weights-only checkpoint without
            ``model=`` says so), or they do not fit ``model``.
        UnsafeCheckpointContent: a Lambda layer with ``safe_mode=True``.
        UntrustedCode: the config names code the caller did not allow (nothing imported).
        SignatureError: a verify key is set and the checkpoint is unsigned or altered.
        InvalidConfig: neither or both of ``trial_id`` and ``checkpoint_uuid``.

    Example::

        model = ckptstore.load_checkpoint_model(trial_id=3, best_by="val_accuracy",
                                                smaller_is_better=False)
    """
    with registry_and_storage(storage, registry, follow=True) as (reg, storage_for):
        uuid, recorded_url = resolve_checkpoint(
            reg, storage_for, trial_id, checkpoint_uuid, best_by, smaller_is_better
        )
        store = storage_for(recorded_url)
        if storage is not None and recorded_url and recorded_url != store.url:
            logger.warning(
                "Loading checkpoint %s from storage=%s as asked; the registry recorded it in %s.",
                uuid,
                store.url,
                recorded_url,
            )
        return _download_and_load(
            store,
            uuid,
            compile=compile,
            custom_objects=custom_objects,
            safe_mode=safe_mode,
            cache=cache,
            modules=modules,
            verify_key=verify_key,
            model=model,
        )


def _download_and_load(
    store: Storage,
    uuid: str,
    *,
    compile: bool,
    custom_objects: Mapping[str, Any] | None,
    safe_mode: bool,
    cache: bool | None = None,
    modules: Sequence[str] = (),
    verify_key: str | os.PathLike[str] | None = None,
    model: KerasModel | Callable[[], KerasModel] | None = None,
) -> KerasModel | SavedModelPredictor:
    """Load checkpoint ``uuid`` (checksums verified): its ``.keras`` file alone, read in place on
    a local store, or into ``model`` when given (:func:`._into_model.load_into_model`); every
    file (the SavedModel too) only for a checkpoint without a ``.keras`` file."""
    from ckptstore.checkpointing import CheckpointContext

    ckpt = CheckpointContext(store, verify=True, cache=cache, verify_key=verify_key)
    logger.info("Loading checkpoint %s from %s", uuid, store.url)
    loaded = None
    try:
        # model=: the caller's model takes any layout's weights (Keras 2's too): every file.
        if model is None:
            options = {"compile": compile, "custom_objects": custom_objects, "safe_mode": safe_mode}
            loaded = _load_archive_of(ckpt, uuid, modules=modules, **options)
    except BaseException:
        with _suppress():
            ckpt.close()
        raise
    if loaded is not None:
        with _suppress():  # lets context.evaluate() record metrics against this checkpoint
            loaded._ckptstore_checkpoint_uuid = uuid
        with _suppress():
            ckpt.close()
        return loaded
    tmp = tempfile.mkdtemp(prefix=f"ckptstore-load-{uuid[:8]}-")
    try:
        ckpt.download(uuid, tmp)
        if model is not None:
            model = load_into_model(model, tmp, uuid)
        else:
            model = load_model_from_folder(
                tmp,
                compile=compile,
                custom_objects=custom_objects,
                safe_mode=safe_mode,
                modules=modules,
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with _suppress():  # lets context.evaluate() record metrics against this checkpoint
        model._ckptstore_checkpoint_uuid = uuid
    if _find_keras_file(tmp) is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        # A SavedModel may read assets lazily: keep the files while the model lives.
        import weakref

        weakref.finalize(model, shutil.rmtree, tmp, True)
    with _suppress():
        ckpt.close()
    return model


def _load_archive_of(ckpt: Any, uuid: str, **options: Any) -> KerasModel | None:
    """The model of checkpoint ``uuid``'s ``.keras`` file, the only file read (None: it has
    none). A deduplicated one on a local store is read in place from its chunk files (verified
    first; never reassembled), any other from the checkpoint folder or a verified download."""
    archives = sorted(filter(_keras_archive, ckpt._manifest(uuid).files))
    if not archives:
        return None
    name = MODEL_FILENAME if MODEL_FILENAME in archives else archives[0]
    views: dict[str, Any] = {name: None} if len(archives) == 1 or name == MODEL_FILENAME else {}
    with ckpt.read_in_place(uuid, selector=_keras_archive, views=views) as folder:
        view = views.get(name)
        if view is not None:
            return load_archive(view, **options)
        keras_file = _find_keras_file(os.fspath(folder))
        return None if keras_file is None else load_archive(keras_file, checked=True, **options)


def _keras_archive(rel: str) -> bool:
    """Whether ``rel`` is a ``.keras`` file at the top of a checkpoint (what loads a model)."""
    return "/" not in rel and rel.endswith(".keras")


@contextlib.contextmanager
def registry_and_storage(
    storage: StorageSpec | None, registry: Registry | str | None, *, follow: bool = False
) -> Iterator[tuple[Registry, Callable[[str | None], Any]]]:
    """The registry (opened from ``registry`` unless it is one) and a :func:`storage_opener`;
    on exit, closes the storages it opened and the registry if it opened it."""
    from ckptstore.registry import Registry, open_registry

    opened: list[Any] = []
    storage_for = storage_opener(storage, opened, follow=follow)
    owns_registry = not isinstance(registry, Registry)
    reg = open_registry(registry)
    try:
        yield reg, storage_for
    finally:
        for s in opened:
            with _suppress():
                s.close()
        if owns_registry:
            with _suppress():
                reg.close()


def _suppress() -> Any:
    return contextlib.suppress(Exception)


__all__ = [
    "MODEL_FILENAME",
    "SAVED_MODEL_DIRNAME",
    "SavedModelPredictor",
    "load_checkpoint_model",
    "load_folder_in_place",
    "load_model_from_folder",
    "resolve_checkpoint",
]


def __getattr__(name: str) -> Any:
    # The old name of load_model_from_folder: ckptstore.keras.load_model_from_checkpoint_path is
    # the one function of that name (it also reads Determined's layouts).
    if name == "load_model_from_checkpoint_path":
        import warnings

        warnings.warn(
            "ckptstore.keras_io.loaders.load_model_from_checkpoint_path is now "
            "ckptstore.keras_io.loading.load_model_from_folder; the old name goes away in "
            "ckptstore 0.3. Use ckptstore.keras.load_model_from_checkpoint_path (every layout).",
            DeprecationWarning,
            stacklevel=2,
        )
        return load_model_from_folder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def storage_opener(
    storage: StorageSpec | None, opened: list[Any], *, follow: bool = False
) -> Callable[[str | None], Any]:
    """``storage_for(url)``: the explicit ``storage`` if given (it always wins over the URL a
    registry row recorded), else that URL when :func:`~ckptstore.checkpointing.row_storage.
    storage_of_row` trusts it (``follow``: a user's own load follows bucket URLs), else
    ``CKPTSTORE_STORAGE``, else the default folder.
    Storages it opens are appended to ``opened`` for the caller to close."""
    from ckptstore.checkpointing.row_storage import open_row_storage
    from ckptstore.storage_backends.spec import resolve

    def storage_for(url: str | None = None) -> Any:
        config = resolve(storage)
        if config.instance is not None:
            return config.instance
        # a registry row's URL only when no storage was given, and where the caller trusts it
        opened.append(open_row_storage(config, url if storage is None else None, follow=follow))
        return opened[-1]

    return storage_for
