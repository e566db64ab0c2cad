"""A Keras model from a ``.keras`` archive, for inference or further training: its config
through the trust checks, its weights read by HDF5 where they are (issue 41).

``keras.saving.load_model("model.keras")`` reads the whole weights entry out of the zip into
memory before HDF5 parses it, and a deduplicated ``model.keras`` of a local store would first
have to be reassembled from its chunks (a 312 MiB copy). :func:`load_archive` does what Keras's
own folder loader does (``saving_lib._load_model_from_dir``: the model built from
``config.json``, then its variables read from ``model.weights.h5``) without a folder or a copy:
the config read out of the archive and checked (:mod:`.._code_refs`: nothing a checkpoint names
is imported without the caller's say-so) before Keras sees it, the weights read through
:func:`.._weights_view.weights_file` — a link to the archive itself, or, for a deduplicated file
read in place (a verified :class:`~ckptstore.checkpointing.chunk_view.ChunkedFile`), a file
object over its chunk files. An archive holding anything else (assets), or whose weights cannot
be read that way, goes through Keras's own reader.

Example::

    model = load_archive("ckpt/model.keras", compile=True, custom_objects=None, safe_mode=True)
"""

from __future__ import annotations

import contextlib
import re
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ckptstore import errors
from ckptstore.checkpointing.chunk_view import ChunkedFile
from ckptstore.checkpointing.format import MAX_MANIFEST_BYTES
from ckptstore.keras_io.saving import _skipsets as skipsets
from ckptstore.keras_io.saving import _weights_view as weights_view
from ckptstore.keras_io.saving._code_refs import (
    check_code_refs,
    import_allowed,
    imported_objects,
)
from ckptstore.keras_io.saving._keras_archive import CONFIG_NAME, METADATA_NAME, WEIGHTS_NAME

_UNKNOWN_CLASS = re.compile(r"Could not locate (?:class|function) '([^']+)'")
#: The entries of an archive :func:`load_archive` reads itself (anything else: Keras's reader).
_PLAIN = frozenset({CONFIG_NAME, METADATA_NAME, WEIGHTS_NAME})


def check_archive(keras_file: str) -> None:
    """Refuse a truncated or damaged ``.keras`` zip with a message that says so (Keras itself
    reports such a file as "File not found" or an unsupported format)."""
    try:
        with zipfile.ZipFile(keras_file) as archive:
            bad = archive.testzip()  # reads every member and checks its CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        bad, reason = "", f"{type(exc).__name__}: {exc}"
    else:
        reason = f"member {bad!r} fails its CRC-32 check" if bad else ""
    if bad is not None:
        raise errors.ModelLoadError(
            f"{keras_file} is not a complete Keras archive: it is truncated or damaged "
            f"({reason}). Download the checkpoint again (ckptstore verifies every file against "
            "its manifest) or load another checkpoint."
        )


def _read_config(source: str | ChunkedFile) -> tuple[bytes | None, bool]:
    """``(config.json or None, plain)``: ``plain`` when the archive holds only the entries
    :func:`load_archive` reads itself."""
    opened = source if isinstance(source, str) else weights_view.RangeFile.whole(source)
    with zipfile.ZipFile(opened) as archive:
        names = set(archive.namelist())
        if CONFIG_NAME not in names:
            return None, False  # not a model archive: Keras says so itself
        with archive.open(CONFIG_NAME) as f:
            config = f.read(MAX_MANIFEST_BYTES + 1)  # larger: refused by the check below
    return config, names <= _PLAIN and WEIGHTS_NAME in names


def check_config(
    config: bytes | None,
    what: str,
    custom_objects: Mapping[str, Any] | None,
    modules: Sequence[str],
) -> dict[str, Any]:
    """Refuse a ``config.json`` that names code the caller did not allow (before Keras reads
    it: older Keras 3 imports any module a config names), then import the allowed modules it
    names. Returns the caller's ``custom_objects`` plus the classes of modules this process
    already imported that the config names (Keras 3 would not find them)."""
    if config is None:
        return dict(custom_objects or {})
    if config.strip() == b"null":  # written by DeterminedCallback for a model without config
        raise errors.ModelLoadError(
            f"{what} holds no full model, only its weights and optimizer state: the "
            "model's config could not be saved (see the checkpoint's metadata 'missing'). "
            "Build the model in code and pass it: load_checkpoint_model(..., model=my_model) "
            "(or a function returning it)."
        )
    allowed = check_code_refs(config, what=what, modules=modules, custom_objects=custom_objects)
    import_allowed(allowed, what)
    return {**imported_objects(config), **(custom_objects or {})}


def load_archive(
    source: str | ChunkedFile,
    *,
    compile: bool,
    custom_objects: Mapping[str, Any] | None,
    safe_mode: bool,
    modules: Sequence[str] = (),
    checked: bool = False,
) -> Any:
    """The model of archive ``source`` (a path, or a verified view of a deduplicated file);
    ``checked``: a path whose size and crc32c matched its manifest (no second CRC pass).

    Raises:
        ModelLoadError, UnsafeCheckpointContent, UntrustedCode: as
            :func:`~ckptstore.keras_io.loading.load_model_from_folder`.
    """
    what = source if isinstance(source, str) else source.name
    if isinstance(source, str) and not checked:
        check_archive(source)
    try:
        config, plain = _read_config(source)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise errors.ModelLoadError(f"Could not read {what}: {exc}") from exc
    objects = check_config(config, what, custom_objects, modules) or None
    with keras_errors(what):
        if plain and config is not None:
            model = _from_config_and_weights(source, config, objects, compile, safe_mode)
            if model is not None:
                return model
        model = _keras_reader(source, objects, compile, safe_mode)
    if not getattr(model, "built", True):
        raise errors.ModelLoadError(
            f"{what} holds a model that its config rebuilds unbuilt (a subclassed model whose "
            "parts are built only when its train_step calls them, such as keras-io's SimCLR), "
            "so Keras could not put its weights in. Build the model in code (call each part on "
            "a batch) and pass it: load_checkpoint_model(..., model=build_model)."
        )
    return model


def _from_config_and_weights(
    source: str | ChunkedFile,
    config: bytes,
    objects: Mapping[str, Any] | None,
    compile: bool,
    safe_mode: bool,
) -> Any:
    """Keras's folder load without the folder (None: this Keras has no such steps, or the
    weights cannot be read in place: Keras's own reader then loads the archive)."""
    from keras.src.saving import saving_lib

    if not hasattr(saving_lib, "_model_from_config"):
        return None
    with weights_view.weights_file(source) as (weights, how):
        if how is None:
            return None
        model = saving_lib._model_from_config(config, objects, compile, safe_mode)
        if not model.built:  # Keras's own reader reports what it cannot restore
            return None
        skipsets.prime(model)
        saving_lib.load_weights_only(model, weights)
        skipsets.share()
    return model


def _keras_reader(
    source: str | ChunkedFile, objects: Mapping[str, Any] | None, compile: bool, safe_mode: bool
) -> Any:
    """``keras.saving.load_model`` of the archive (a view: as a file object, no copy)."""
    import keras
    from keras.src.saving import saving_lib

    options = {"custom_objects": objects, "compile": compile, "safe_mode": safe_mode}
    if isinstance(source, ChunkedFile):
        return saving_lib.load_model(weights_view.RangeFile.whole(source), **options)
    return keras.saving.load_model(source, **options)


@contextlib.contextmanager
def keras_errors(what: str) -> Iterator[None]:
    """Keras's load errors for ``what`` as ckptstore's typed ones, saying what to do."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        message = str(exc)
        if "safe_mode" in message and ("Lambda" in message or "lambda" in message):
            raise errors.UnsafeCheckpointContent(
                f"{what} contains a Lambda layer holding Python bytecode, which could run "
                "arbitrary code, so it was not loaded. If you trust this checkpoint, pass "
                "safe_mode=False."
            ) from exc
        missing = _UNKNOWN_CLASS.search(message)
        if missing or "could not be deserialized" in message:
            name = f"'{missing.group(1)}'" if missing else "a custom layer, loss or metric"
            raise errors.ModelLoadError(
                f"{what} uses {name}, which Keras does not know. Import the module that "
                "defines it (decorated with @keras.saving.register_keras_serializable()) or pass "
                f"custom_objects={{{name if missing else repr('Name')}: TheClass}}."
            ) from exc
        raise errors.ModelLoadError(f"Keras could not load {what}: {exc}") from exc
    except OSError as exc:
        raise errors.ModelLoadError(f"Could not read {what}: {exc}") from exc


__all__ = ["check_archive", "check_config", "keras_errors", "load_archive"]
