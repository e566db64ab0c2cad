"""Download a checkpoint into a folder and verify it, for ``checkpoint download``/``verify``
and ``model download``; plus the ``-o``/``--selector`` options both download verbs take.

Example::

    report = download_checkpoint(state, uuid, "./ckpt", ["*.keras"])
    print(f"{len(report.files)} files, {report.from_storage} bytes from storage")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ckptstore import errors
from ckptstore.cli.progress import transfer_progress
from ckptstore.cli.state import CliState

if TYPE_CHECKING:
    from ckptstore.checkpointing.format import Manifest
    from ckptstore.checkpointing.restore import DownloadReport
    from ckptstore.storage_backends import Storage

F = TypeVar("F", bound=Callable[..., Any])


def read_committed_manifest(storage: Storage, uuid: str) -> Manifest:
    """The manifest of a committed checkpoint; CheckpointNotFound if nothing is stored."""
    from ckptstore.checkpointing import format as ckpt_format

    if not storage.exists(uuid):
        raise errors.CheckpointNotFound(
            f"Checkpoint {uuid} has no files in storage {storage.url}; it was deleted or lives "
            "in another storage (pass --storage)."
        )
    return ckpt_format.load_manifest(storage, uuid)


def download_checkpoint(
    state: CliState,
    uuid: str,
    out_dir: str,
    selector: Any = None,
    *,
    label: str = "Downloading",
    cache: bool | None = None,
    sha256: dict[str, str] | None = None,
    verify_key: str | None = None,
) -> DownloadReport:
    """Download (with a progress bar on a terminal) and verify checkpoint ``uuid``, through
    the restore cache unless ``cache=False``; a damaged blob is reported with every
    checkpoint in the prefix that uses it. ``sha256`` receives every file's SHA-256 (from
    the read that checks its crc32c). ``verify_key``: the checkpoint's signature must check
    out with it (``signing.verify_key()`` for the environment's)."""
    from ckptstore.checkpointing import blob_gc, restore, signing
    from ckptstore.checkpointing import format as ckpt_format

    try:
        record = state.registry().get_checkpoint(uuid)
        uuid = record.uuid  # a unique prefix names the whole UUID from here on
        storage = state.storage_for(record, follow=True)  # a download for this user
    except errors.CheckpointNotFound:
        storage = state.storage()  # not registered: try --storage directly
    manifest = read_committed_manifest(storage, uuid)
    select = ckpt_format.compile_selector(selector)
    # The manifest and metadata always come along, so the folder stays self-describing.
    wanted = {
        rel: entry
        for rel, entry in manifest.files.items()
        if select(rel) or rel in (ckpt_format.METADATA_NAME, signing.SIGNATURE_NAME)
    }
    total = sum(e.size for e in wanted.values())
    with transfer_progress(f"{label} {uuid[:8]}", total) as progress:
        try:
            if verify_key is None:
                report = restore.download_checkpoint(
                    storage,
                    uuid,
                    manifest,
                    out_dir,
                    wanted.__contains__,
                    cache=cache,
                    progress=progress,
                    sha256=sha256,
                )
            else:
                report = restore.download_signed(
                    storage,
                    uuid,
                    manifest,
                    out_dir,
                    wanted.__contains__,
                    verify_key,
                    partial=selector is not None,
                    cache=cache,
                    progress=progress,
                )
        except errors.ChecksumMismatch as exc:
            sha = getattr(exc, "blob", None)
            if sha is None:
                raise
            using = blob_gc.users(storage, sha)
            raise errors.ChecksumMismatch(
                f"{exc} Checkpoints using this blob ({len(using)}): {', '.join(using)}."
            ) from None
    with open(os.path.join(out_dir, ckpt_format.MANIFEST_NAME), "wb") as f:
        f.write(manifest.to_bytes())
    return report


def download_options(default_folder: str) -> Callable[[F], F]:
    """``-o/--output`` (into ``out_dir``), ``--selector`` (into ``selectors``) and
    ``--no-cache`` (into ``no_cache``: skip the restore cache) for a verb.

    ``default_folder`` names the folder used without ``-o`` in the help text, e.g. ``"./UUID"``.
    """
    output = click.option(
        "-o",
        "--output",
        "out_dir",
        type=click.Path(file_okay=False),
        help=f"Target folder (default {default_folder}).",
    )
    selector = click.option(
        "--selector",
        "selectors",
        multiple=True,
        metavar="GLOB",
        help="Only files matching (repeatable).",
    )

    no_cache = click.option(
        "--no-cache",
        is_flag=True,
        help="Fetch every byte from storage (skip the local restore cache; CKPTSTORE_CACHE=off).",
    )

    def decorate(command: F) -> F:
        return output(selector(no_cache(command)))

    return decorate
