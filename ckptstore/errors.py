"""Typed exceptions of ckptstore.

Every error raised on purpose by ckptstore is a subclass of :class:`CkptstoreError`. Messages say
what was wrong and what to do about it, and never contain credentials.

Example::

    import ckptstore
    try:
        ckptstore.load_checkpoint_model(checkpoint_uuid="no-such-uuid")
    except ckptstore.errors.CheckpointNotFound as exc:
        print(exc)
"""

from __future__ import annotations

from ckptstore.masking import mask_text


class CkptstoreError(Exception):
    """Base class of every ckptstore error. Its message goes through the one masking rule
    (:func:`ckptstore.masking.mask_text`), so a URL password, a ``?password=`` or a
    ``token=...`` received from the caller is never repeated back."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(mask_text(a) if isinstance(a, str) else a for a in args))


# --- storage -----------------------------------------------------------------------------------
class StorageError(CkptstoreError):
    """A storage operation failed."""


class StorageNotFound(StorageError, FileNotFoundError):
    """The bucket, container, prefix or object does not exist."""


class StorageAuthError(StorageError):
    """The credentials were missing, wrong or expired."""


class StoragePermissionError(StorageError, PermissionError):
    """The credentials are valid but lack a permission the operation needs."""


class InvalidStoragePath(StorageError, ValueError):
    """A key or relative path would escape the configured prefix, or is malformed."""


class StorageUnavailable(StorageError):
    """The storage service kept failing (5xx, throttling, timeouts) after all retries."""


class InvalidStorageConfig(StorageError, ValueError):
    """A storage URL or ``checkpoint_storage`` dict is malformed or names an unknown type."""


class StorageNotAllowed(InvalidStorageConfig):
    """A registry row names a storage the caller neither opened nor allowed
    (:mod:`ckptstore.checkpointing.row_storage`)."""


class MissingDependency(CkptstoreError, ImportError):
    """An optional package needed for a backend or feature is not installed."""


# --- checkpoints -------------------------------------------------------------------------------
class CheckpointError(CkptstoreError):
    """A checkpoint could not be written, read or found."""


class CheckpointNotFound(CheckpointError, LookupError):
    """No committed checkpoint with that UUID (or for that trial) exists."""


class InvalidCheckpoint(CheckpointError):
    """A checkpoint's MANIFEST.json or metadata.json is missing, malformed or unsafe."""


class CheckpointDeleted(CheckpointNotFound, InvalidCheckpoint):
    """The checkpoint was deleted: its folder holds only the tombstone deletes and GC leave in
    its commit slot. Not found (exit 3), and "not a checkpoint" to code that catches
    :class:`InvalidCheckpoint`."""


class SignatureError(InvalidCheckpoint):
    """A verify key is configured and the checkpoint is unsigned, signed by another key, or
    altered after signing (:mod:`ckptstore.checkpointing.signing`); nothing read it (exit 5)."""


class UnsafeCheckpointPath(InvalidStoragePath, InvalidCheckpoint):
    """A file name in a checkpoint breaks the one rule for checkpoint contents
    (:func:`ckptstore.storage_backends.paths.check_key`): raised by writers before anything is
    committed, and by readers for a manifest entry (as its subclass
    :class:`UnsafeManifestEntry`). It is both an :class:`InvalidStoragePath` and an
    :class:`InvalidCheckpoint`."""


class UnsafeManifestEntry(UnsafeCheckpointPath):
    """An entry of a stored ``MANIFEST.json`` breaks the path rule: the checkpoint is damaged
    or was not written by ckptstore (CLI exit 5, where a writer's bad file name is exit 2)."""


class ChecksumMismatch(CheckpointError):
    """A downloaded file's size or crc32c differs from the checkpoint's manifest."""


class CheckpointConflict(CheckpointError):
    """Two writers (e.g. two ranks of a sharded upload) produced the same file or UUID."""


class BackgroundUploadError(CheckpointError):
    """A background upload failed; raised from ``wait()`` or the next save."""


class UnsafeCheckpointContent(CheckpointError):
    """The checkpoint holds content that would execute code (pickle, Lambda layers) and the
    caller did not allow it."""


class UntrustedCode(UnsafeCheckpointContent, InvalidCheckpoint):
    """A checkpoint's model config names a module or class the caller did not allow
    (:mod:`ckptstore.keras_io.saving._code_refs`), or its Determined ``code/`` folder would be
    imported without ``trust_code=True``: nothing was imported (CLI exit 5)."""


# --- registry ----------------------------------------------------------------------------------
class RegistryError(CkptstoreError):
    """The registry database could not be opened, migrated or written."""


class TrialNotFound(RegistryError, LookupError):
    """No trial with that id is registered."""


class ExperimentNotFound(RegistryError, LookupError):
    """No experiment with that id is registered."""


class JobNotFound(RegistryError, LookupError):
    """No job with that id in the registry."""


class ModelNotFound(RegistryError, LookupError):
    """No registered model with that name (or version) exists."""


class ModelVersionConflict(RegistryError):
    """A model name, version or alias is already taken."""


# --- keras / experiments -----------------------------------------------------------------------
class InvalidConfig(CkptstoreError, ValueError):
    """An experiment config, hyperparameter or API argument is invalid."""


class InvalidExperimentException(InvalidConfig):
    """Determined's ``det.errors.InvalidExperimentException``: the experiment cannot train as
    configured; raised where Determined raises it (a TFKerasTrial's ``global_batch_size``
    hyperparameter missing or not a positive int).

    A subclass of :class:`InvalidConfig`, so ``except InvalidConfig`` keeps catching it (in
    Determined it derives from ``BaseException``; ``except Exception`` catches it here).

    Example::

        try:
            context.get_global_batch_size()
        except det.errors.InvalidExperimentException as exc:
            print(exc)   # ... Received: hyperparameters without 'global_batch_size' ...
    """


class UnreachableFromCluster(InvalidConfig):
    """A registry or storage that lives on this machine (a SQLite file, a local folder) was
    given for trials that run on other machines (Ray nodes on other hosts)."""


class ExperimentNotCompleted(CkptstoreError):
    """An experiment run ended without completing: a trial failed, or it was interrupted."""


class ExperimentInterrupted(ExperimentNotCompleted):
    """An experiment run stopped by Ctrl-C (SIGINT): its trials checkpointed and it is PAUSED;
    ``ckptstore experiment resume ID`` continues each trial from its latest checkpoint (stopped
    before the experiment was recorded, nothing ran)."""


class JobFailed(CkptstoreError):
    """A job (``ckptstore job run``) exited non-zero or was stopped."""


class NotInTraining(CkptstoreError, AttributeError):
    """A training-only API (``context.training``) was used in a job that does not train."""


class ModelLoadError(CkptstoreError):
    """A checkpoint's model could not be rebuilt (unknown custom objects, missing files, ...)."""


class ExportError(CkptstoreError):
    """An inference SavedModel could not be exported or did not predict what the model does."""


class KerasMismatch(CkptstoreError, TypeError):
    """A model of one Keras (``keras`` 3 / ``tf_keras`` 2) handed to ckptstore running on the other."""


class ResumeError(CkptstoreError):
    """Training state could not be restored exactly from a checkpoint."""


class InvalidHP(CkptstoreError):
    """Determined's ``det.InvalidHP``: training code raises it to say this trial's
    hyperparameters cannot be trained (``msg`` says why)."""

    def __init__(self, msg: str = "Invalid hyperparameters were given.") -> None:
        super().__init__(msg)
        self.msg = msg


class NotSupported(CkptstoreError, NotImplementedError):
    """A Determined API that needs a Determined cluster (master, agents, Horovod, the profiler),
    or a Keras backend a feature does not run on (TFKerasTrial off TensorFlow; DeterminedCallback
    off TensorFlow, JAX and PyTorch).

    The message names the call and what to use instead with ckptstore.
    """


__all__ = [
    name for name, obj in globals().items() if isinstance(obj, type) and issubclass(obj, Exception)
]
