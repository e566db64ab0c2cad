"""Exit codes of the ``ckptstore`` command and the mapping from ckptstore errors to them.

Example::

    from ckptstore import errors
    from ckptstore.cli.errors import exit_code_for

    assert exit_code_for(errors.CheckpointNotFound("x")) == 3
"""

from __future__ import annotations

import click

from ckptstore import errors

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_STORAGE = 4
EXIT_CORRUPT = 5
#: 128 + SIGINT, the shell's code for Ctrl-C: the experiment is PAUSED, not failed.
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\b
Exit codes:
  0  success
  1  other error
  2  bad input (usage, invalid config, URL or argument)
  3  not found (checkpoint, trial, experiment, model, storage object)
  4  storage failure (unreachable, auth, permission, retries exhausted)
  5  checkpoint corrupt or untrusted (checksum mismatch, bad manifest, refused code)
  130  interrupted by Ctrl-C: the experiment is PAUSED; `experiment resume ID` goes on
"""

# Order matters: the first matching class wins (subclasses before their bases).
_TABLE: tuple[tuple[type[BaseException], int], ...] = (
    (errors.CheckpointNotFound, EXIT_NOT_FOUND),
    (errors.TrialNotFound, EXIT_NOT_FOUND),
    (errors.ExperimentNotFound, EXIT_NOT_FOUND),
    (errors.JobNotFound, EXIT_NOT_FOUND),
    (errors.ModelNotFound, EXIT_NOT_FOUND),
    (errors.StorageNotFound, EXIT_NOT_FOUND),
    (errors.UnsafeManifestEntry, EXIT_CORRUPT),
    (errors.UntrustedCode, EXIT_CORRUPT),
    (errors.InvalidStoragePath, EXIT_BAD_INPUT),
    (errors.InvalidStorageConfig, EXIT_BAD_INPUT),
    (errors.InvalidConfig, EXIT_BAD_INPUT),
    (errors.UnsafeCheckpointContent, EXIT_BAD_INPUT),
    (errors.ModelVersionConflict, EXIT_BAD_INPUT),
    (errors.StorageError, EXIT_STORAGE),
    (errors.ChecksumMismatch, EXIT_CORRUPT),
    (errors.InvalidCheckpoint, EXIT_CORRUPT),
    (errors.ExperimentInterrupted, EXIT_INTERRUPTED),
    (errors.CkptstoreError, EXIT_ERROR),
)


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code for an exception (1 for anything not listed)."""
    for cls, code in _TABLE:
        if isinstance(exc, cls):
            return code
    return EXIT_ERROR


class CkptstoreCliError(click.ClickException):
    """A ckptstore error shown as ``Error: <message>`` with its own exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def translate_error(exc: BaseException) -> click.ClickException | None:
    """A click exception for ckptstore errors; None for anything else (re-raised as is)."""
    if isinstance(exc, errors.CkptstoreError):
        return CkptstoreCliError(f"{type(exc).__name__}: {exc}", exit_code_for(exc))
    return None
