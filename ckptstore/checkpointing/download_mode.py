"""``DownloadMode``: Determined's argument saying whether the workers of one machine share a
checkpoint download (``core.DownloadMode``), and the one check of its values.

ckptstore accepts both modes with the same result (the checkpoint's verified files in a local
folder). On local storage every worker reads the committed folder in place, so nothing is
downloaded; on object storage each process downloads its own copy, which is what
``NoSharedDownload`` means and costs only bandwidth compared with a shared download.

Example::

    from ckptstore.core import DownloadMode

    with core_context.checkpoint.restore_path(uuid, DownloadMode.NoSharedDownload) as path:
        model.load_weights(path / "model.weights.h5")
"""

from __future__ import annotations

import enum

from ckptstore.validators import enum_member


class DownloadMode(enum.Enum):
    """How workers on one machine get a checkpoint's files (Determined's names and values)."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def check_download_mode(download_mode: DownloadMode | str) -> DownloadMode:
    """``download_mode`` as a :class:`DownloadMode` (its value string is accepted too)."""
    return enum_member(DownloadMode, download_mode, "download_mode", "ckptstore.core.")


__all__ = ["DownloadMode", "check_download_mode"]
