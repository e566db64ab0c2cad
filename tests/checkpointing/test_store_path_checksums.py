"""store_path(checksums=...): a writer's own crc32c goes into the manifest, the file is not re-read."""

from __future__ import annotations

import os

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import checksums as ckpt_checksums
from ckptstore.checkpointing import format as fmt


def test_given_checksum_is_used_and_others_are_computed(local_and_s3_url, tmp_path, monkeypatch):
    data = os.urandom(5000)
    read_again: list[str] = []
    real = ckpt_checksums.file_sums

    def spy(path: str, *, crc32c: bool = True, sha256: bool = False) -> tuple:
        if crc32c:
            read_again.append(os.path.basename(path))
        return real(path, crc32c=crc32c, sha256=sha256)

    monkeypatch.setattr(fmt, "file_sums", spy)
    with CheckpointContext(local_and_s3_url) as ctx:
        checksums: dict[str, str] = {}
        with ctx.store_path({"steps_completed": 1}, checksums=checksums) as (path, uuid):
            with open(os.path.join(path, "big.bin"), "wb") as f:
                f.write(data)
            with open(os.path.join(path, "small.txt"), "wb") as f:
                f.write(b"x")
            checksums["big.bin"] = ckpt_checksums.crc32c_bytes(data)
        manifest = fmt.read_manifest(ctx.storage, uuid)
        entry = manifest["files"]["big.bin"]
        assert (entry["size"], entry["crc32c"]) == (5000, ckpt_checksums.crc32c_bytes(data))
        assert manifest["files"]["small.txt"]["crc32c"] == ckpt_checksums.crc32c_bytes(b"x")
        assert "big.bin" not in read_again and "small.txt" in read_again
        monkeypatch.setattr(fmt, "file_sums", real)
        with ctx.restore_path(uuid) as restored:  # verifies sizes and checksums
            assert open(os.path.join(restored, "big.bin"), "rb").read() == data


def test_a_wrong_given_checksum_fails_verification_on_restore(tmp_path):
    with CheckpointContext(str(tmp_path / "ckpts")) as ctx:
        with ctx.store_path({}, checksums={"a.bin": "00000000"}) as (path, uuid):
            with open(os.path.join(path, "a.bin"), "wb") as f:
                f.write(b"abc")
        with pytest.raises(errors.ChecksumMismatch, match="a.bin"):
            with ctx.restore_path(uuid):
                pass


def test_malformed_checksum_is_refused(tmp_path):
    with CheckpointContext(str(tmp_path / "ckpts")) as ctx:
        with pytest.raises(errors.InvalidConfig, match="8 lowercase hex"):
            with ctx.store_path({}, checksums={"a.bin": "xyz"}) as (path, _uuid):
                with open(os.path.join(path, "a.bin"), "wb") as f:
                    f.write(b"abc")
        assert scan.list_committed(ctx.storage) == []
