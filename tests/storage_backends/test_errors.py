"""Retries and error mapping against real servers: unreachable endpoints, missing buckets,
transient failures that recover."""

import pytest

from ckptstore import errors
from ckptstore.storage_backends import open_storage
from ckptstore.storage_backends.retry import RetryPolicy
from tests._helpers.ports import free_port


def _dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_unreachable_s3_gives_unavailable_after_bounded_retries(caplog):
    storage = open_storage(
        "s3://bucket/x", endpoint_url=_dead_endpoint(), max_attempts=3, timeout=2,
        access_key="AK", secret_key="do-not-leak",
    )  # fmt: skip
    with pytest.raises(errors.StorageUnavailable, match=r"s3://bucket/x/k.*3 attempts"):
        storage.read_bytes("k")
    retries = [r for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 2
    assert not [r for r in caplog.records if "do-not-leak" in r.getMessage()]


def test_unreachable_gcs_gives_unavailable(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", _dead_endpoint())
    storage = open_storage("gs://bucket/x", max_attempts=2, timeout=2)
    with pytest.raises(errors.StorageUnavailable, match="gs://bucket/x"):
        storage.list("")


def test_unreachable_azure_gives_unavailable():
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        f"BlobEndpoint={_dead_endpoint()}/devstoreaccount1;"
    )
    storage = open_storage("az://c/x", connection_string=conn, max_attempts=2, timeout=2)
    with pytest.raises(errors.StorageUnavailable, match="az://c/x"):
        storage.write_bytes("k", b"v")


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_missing_bucket_is_not_found_and_not_retried(kind, storage_url_factory, caplog):
    url = storage_url_factory(kind)
    scheme = url.split("://")[0]
    storage = open_storage(f"{scheme}://no-such-bucket-ckpt/p", max_attempts=4)
    with pytest.raises(errors.StorageNotFound, match="no-such-bucket-ckpt"):
        storage.write_bytes("k", b"v")
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def test_azure_wrong_key_is_typed_and_not_leaked(azure_server, storage_url_factory):
    # Real Azure answers a bad key with 403 AuthenticationFailed (-> StorageAuthError); Azurite
    # answers 403 AuthorizationFailure (-> StoragePermissionError). Either is a typed refusal.
    url = storage_url_factory("azure")
    conn = azure_server.env["AZURE_STORAGE_CONNECTION_STRING"]
    key = conn.split("AccountKey=")[1].split(";")[0]
    bad = conn.replace(key, "d3Jvbmcta2V5LXdyb25nLWtleQ==")
    storage = open_storage(url, connection_string=bad, max_attempts=2)
    with pytest.raises((errors.StorageAuthError, errors.StoragePermissionError)) as info:
        storage.write_bytes("k", b"v")
    assert "d3Jvbmcta2V5" not in str(info.value) and key not in str(info.value)


def test_transient_failures_are_retried_then_succeed(storage_url_factory, monkeypatch):
    import botocore.exceptions

    storage = open_storage(storage_url_factory("s3"), max_attempts=4)
    storage.write_bytes("k", b"v")
    real = storage._client.get_object
    calls = {"n": 0}

    def flaky(**kwargs):
        calls["n"] += 1
        if calls["n"] < 3:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}},
                "GetObject",
            )
        return real(**kwargs)

    monkeypatch.setattr(storage._client, "get_object", flaky)
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.0)
    assert storage.read_bytes("k") == b"v"
    assert calls["n"] == 3


def test_retry_policy_rejects_bad_values():
    with pytest.raises(errors.InvalidStorageConfig, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(errors.InvalidStorageConfig, match="timeout"):
        RetryPolicy(timeout=-1)
    policy = RetryPolicy(base_delay=1, max_delay=4)
    assert all(0 <= policy.backoff(a) <= min(4, 2 ** (a - 1)) for a in range(1, 8))
