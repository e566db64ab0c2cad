"""What a checkpoint shares with the previous one, for deduplicated (chunk) and whole-file
manifests."""

from __future__ import annotations

from ckptstore.checkpointing.format import Manifest
from ckptstore.ui.sharing import shared_with

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _blobs(*chunks: tuple[str, int]) -> dict:
    return {
        "size": sum(n for _, n in chunks),
        "crc32c": "00000000",
        "blobs": [{"sha256": s, "size": n} for s, n in chunks],
    }


def test_deduplicated_chunks_already_stored_count_as_shared():
    before = {"files": {"model.keras": _blobs((A, 100), (B, 50))}}
    after = {
        "files": {
            "model.keras": _blobs((A, 100), (C, 70)),
            "extra/": {"size": 0, "crc32c": "00000000"},
        }
    }
    sharing = shared_with(Manifest.of(after), Manifest.of(before))
    assert (sharing.shared, sharing.total, sharing.deduplicated) == (100, 170, True)
    assert sharing.files == {"model.keras": 100}


def test_whole_files_share_only_identical_content():
    same = {"size": 10, "crc32c": "12345678"}
    before = {"files": {"vocab.txt": same, "w.npy": {"size": 8, "crc32c": "00000001"}}}
    after = {"files": {"vocab.txt": same, "w.npy": {"size": 8, "crc32c": "00000002"}}}
    sharing = shared_with(Manifest.of(after), Manifest.of(before))
    assert (sharing.files, sharing.shared, sharing.deduplicated) == (
        {"vocab.txt": 10, "w.npy": 0},
        10,
        False,
    )
