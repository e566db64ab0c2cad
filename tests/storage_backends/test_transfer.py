"""Bulk-transfer paths of the object-store backends beyond the conformance suite: GCS's streamed
resumable upload, ranged downloads streamed into place (and retried when the connection is cut
mid-body), the opt-in composite upload, and the Azure transport settings."""

import hashlib
import logging
import os

import numpy as np
import pytest

from ckptstore import errors
from ckptstore.storage_backends import open_storage
from ckptstore.storage_backends.retry import RetryPolicy
from tests._helpers.trees import make_tree
from tests.servers.fault_proxy import FaultProxy

MiB = 2**20


def _tree(root, big_size: int) -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    files = {
        "big.bin": rng.integers(0, 256, big_size, dtype=np.uint8).tobytes(),
        "mid.bin": rng.integers(0, 256, 9 * MiB + 7, dtype=np.uint8).tobytes(),
        "s/small.txt": b"small",
        "s/empty.bin": b"",
    }
    make_tree(root, files)
    return files


def _same_tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        got = (root / rel).read_bytes()
        assert len(got) == len(data), rel
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), rel


GCS_OPTIONS = {"part_size": 3 * MiB, "multipart_threshold": 8 * MiB, "concurrency": 4}


def test_gcs_streamed_upload_and_ranged_download(storage_url_factory, tmp_path):
    files = _tree(tmp_path / "src", 20 * MiB + 123)
    with open_storage(storage_url_factory("gcs"), **GCS_OPTIONS) as storage:
        sizes = storage.upload(str(tmp_path / "src"), "t")
        assert sizes == {rel: len(data) for rel, data in files.items()}
        assert storage.list("t") == dict(sorted(sizes.items()))
        # A streamed resumable upload makes an ordinary object (it has an MD5; a composite
        # object would not).
        blob = storage._bucket.get_blob(storage._name("t/big.bin"))
        assert blob.size == len(files["big.bin"]) and blob.md5_hash
        storage.download("t", str(tmp_path / "dst"))
    _same_tree(tmp_path / "dst", files)
    assert not [n for n in os.listdir(tmp_path / "dst") if "ckptstore-tmp" in n]


def test_gcs_composite_upload_is_opt_in_and_leaves_no_parts(storage_url_factory, tmp_path):
    files = _tree(tmp_path / "src", 20 * MiB + 5)
    url = storage_url_factory("gcs")
    # download ranges bigger than the parts: the composite upload must cut part_size pieces
    options = {**GCS_OPTIONS, "download_part_size": 16 * MiB}
    with open_storage(url, composite_threshold=8 * MiB, **options) as storage:
        composed = []
        real = storage._compose
        storage._compose = lambda target, sources: (
            composed.append((target, len(sources))),
            real(target, sources),
        )
        storage.upload(str(tmp_path / "src"), "t")
        # big.bin (7 parts of 3 MiB) and mid.bin (4 parts) were composed, the parts deleted:
        # only the tree's own objects remain
        assert sorted(composed) == [
            (storage._name("t/big.bin"), 7),
            (storage._name("t/mid.bin"), 4),
        ]
        assert storage.list("") == {f"t/{rel}": len(d) for rel, d in sorted(files.items())}
        storage.download("t", str(tmp_path / "dst"))
    _same_tree(tmp_path / "dst", files)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_gcs_composite_threshold_is_validated(gcs_server, bad):
    with pytest.raises(errors.InvalidStorageConfig, match="composite_threshold"):
        open_storage("gs://bucket/x", composite_threshold=bad)


def _download_through_cuts(url, server, tmp_path, monkeypatch, caplog, options, proxied, cuts):  # type: ignore[no-untyped-def]
    """Upload a tree (big.bin 12 MiB + 1, mid.bin 9 MiB + 7, small ones), then download it
    through a :class:`FaultProxy` that cuts the GETs named in ``cuts`` ({file: how many}) 1 MiB
    into the answer. ``proxied(proxy)`` returns the extra open_storage options (or sets the
    env) that route the client through the proxy. Returns (files, listing seen through the
    proxy, number of retry warnings logged); every cut must have happened."""
    files = _tree(tmp_path / "src", 12 * MiB + 1)
    with open_storage(url, **options) as storage:
        storage.upload(str(tmp_path / "src"), "t")
    host, port = server.endpoint.rsplit("//", 1)[1].split(":")
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.0)
    with FaultProxy(host, int(port)) as proxy:
        extra = proxied(proxy)
        for match, count in cuts.items():
            proxy.reset_next(count, after_bytes=MiB, in_response=True, match=match)
        with (
            caplog.at_level(logging.WARNING),
            open_storage(url, **extra, **options) as storage,
        ):
            listing = storage.list("t")
            storage.download("t", str(tmp_path / "dst"))
        assert proxy.pending == 0
    retries = len([r for r in caplog.records if "retry" in r.getMessage()])
    return files, listing, retries


def test_gcs_download_retries_parts_cut_mid_body(
    storage_url_factory, gcs_server, tmp_path, monkeypatch, caplog
):
    def proxied(proxy):  # type: ignore[no-untyped-def]
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        return {}

    # Two ranged GETs of big.bin (3 MiB parts) lose their connection 1 MiB into the answer;
    # each part must be fetched again, not left short.
    files, _listing, retries = _download_through_cuts(
        storage_url_factory("gcs"), gcs_server, tmp_path, monkeypatch, caplog,
        GCS_OPTIONS, proxied, {"big.bin": 2},
    )  # fmt: skip
    _same_tree(tmp_path / "dst", files)
    assert retries == 2


def test_gcs_download_gives_up_after_the_budget(
    storage_url_factory, gcs_server, tmp_path, monkeypatch
):
    files = _tree(tmp_path / "src", 1 * MiB)
    url = storage_url_factory("gcs")
    with open_storage(url) as storage:
        storage.upload(str(tmp_path / "src"), "t", paths=["big.bin"])
    host, port = gcs_server.endpoint.rsplit("//", 1)[1].split(":")
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.0)
    with FaultProxy(host, int(port)) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        proxy.reset_next(3, after_bytes=1000, in_response=True, match="big.bin")
        with open_storage(url, max_attempts=3) as storage:
            with pytest.raises(errors.StorageUnavailable, match="3 attempts"):
                storage.download("t", str(tmp_path / "dst"))
    # nothing complete-looking was left behind
    assert not (tmp_path / "dst" / "big.bin").exists()
    assert len(files["big.bin"]) == MiB


def test_azure_transport_gets_block_size_and_timeouts(azure_server, storage_url_factory):
    with open_storage(storage_url_factory("azure"), timeout=7) as storage:
        transport = storage._service._client._client._pipeline._transport
        assert transport.connection_config.data_block_size == MiB
        assert transport.connection_config.timeout == 7
        assert transport.connection_config.read_timeout == 7


def test_azure_big_file_round_trip_with_backend_defaults(storage_url_factory, tmp_path):
    files = _tree(tmp_path / "src", 20 * MiB + 3)
    with open_storage(
        storage_url_factory("azure"), part_size=4 * MiB, multipart_threshold=8 * MiB
    ) as storage:
        storage.upload(str(tmp_path / "src"), "t")
        storage.download("t", str(tmp_path / "dst"))
    _same_tree(tmp_path / "dst", files)


def _through_proxy(conn: str, endpoint: str, proxy_url: str) -> str:
    return conn.replace(endpoint, proxy_url)


def test_azure_download_retries_parts_cut_mid_body(
    storage_url_factory, azure_server, tmp_path, monkeypatch, caplog
):
    conn = azure_server.env["AZURE_STORAGE_CONNECTION_STRING"]
    options = {"part_size": 3 * MiB, "multipart_threshold": 8 * MiB, "concurrency": 4}

    def proxied(proxy):  # type: ignore[no-untyped-def]
        return {"connection_string": _through_proxy(conn, azure_server.endpoint, proxy.url)}

    # two ranged GETs of big.bin (3 MiB parts) are cut 1 MiB into the answer
    files, listing, retries = _download_through_cuts(
        storage_url_factory("azure"), azure_server, tmp_path, monkeypatch, caplog,
        options, proxied, {"big.bin": 2},
    )  # fmt: skip
    assert listing == {rel: len(d) for rel, d in sorted(files.items())}
    _same_tree(tmp_path / "dst", files)
    assert retries == 2


def test_azure_missing_blob_and_container_are_not_found(storage_url_factory, tmp_path):
    url = storage_url_factory("azure")
    with open_storage(url) as storage:
        path = str(tmp_path / "x")
        with pytest.raises(errors.StorageNotFound, match="does not exist"):
            storage._call(lambda: storage._download_file("nope", path, 5), "nope", "download")
    container = url.split("://", 1)[1].split("/", 1)[0]
    with open_storage(url.replace(container, "no-such-container-ckpt")) as storage:
        with pytest.raises(errors.StorageNotFound, match="Container"):
            storage._call(lambda: storage._download_file("nope", path, 5), "nope", "download")


S3_OPTIONS = {"part_size": 3 * MiB, "multipart_threshold": 8 * MiB, "concurrency": 4}


def test_s3_multipart_upload_and_ranged_download(storage_url_factory, tmp_path):
    files = _tree(tmp_path / "src", 20 * MiB + 123)
    with open_storage(storage_url_factory("s3"), **S3_OPTIONS) as storage:
        storage.upload(str(tmp_path / "src"), "t")
        # Multipart, and sent with the SDK's request checksum, which the server checked and
        # recorded. S3's smallest part is 5 MiB, so the 3 MiB part_size gives 5 upload parts
        # (downloads use 3 MiB ranges).
        head = storage._client.head_object(
            Bucket=storage.bucket, Key=storage._name("t/big.bin"), ChecksumMode="ENABLED"
        )
        assert head["ETag"].strip('"').endswith("-5")
        assert any(k.startswith("Checksum") and k != "ChecksumType" for k in head)
        storage.download("t", str(tmp_path / "dst"))
    _same_tree(tmp_path / "dst", files)
    assert not [n for n in os.listdir(tmp_path / "dst") if "ckptstore-tmp" in n]


def test_s3_download_retries_parts_cut_mid_body(
    storage_url_factory, s3_server, tmp_path, monkeypatch, caplog
):
    # Two ranged GETs of big.bin (3 MiB parts) and the whole-object GET of mid.bin lose their
    # connection 1 MiB into the answer; each must be fetched again, not left short.
    files, _listing, retries = _download_through_cuts(
        storage_url_factory("s3"), s3_server, tmp_path, monkeypatch, caplog,
        S3_OPTIONS, lambda proxy: {"endpoint_url": proxy.url}, {"big.bin": 2, "mid.bin": 1},
    )  # fmt: skip
    _same_tree(tmp_path / "dst", files)
    assert retries == 3
