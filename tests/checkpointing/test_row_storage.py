"""Issue 27, finding 2: the rule for the storage a registry checkpoint row may send a reader
to (:func:`ckptstore.checkpointing.row_storage.storage_of_row`)."""

from __future__ import annotations

import pytest

from ckptstore import errors
from ckptstore.checkpointing.row_storage import ALLOWED_STORAGE_ENV, storage_of_row


@pytest.fixture(autouse=True)
def _no_env_allow_list(monkeypatch):
    monkeypatch.delenv(ALLOWED_STORAGE_ENV, raising=False)


def test_no_recorded_url_means_the_opened_storage():
    assert storage_of_row(None, "/mnt/ckpts") is None
    assert storage_of_row("", "s3://b/p") is None


@pytest.mark.parametrize(
    ("recorded", "opened"),
    [
        ("file:///mnt/ckpts", "/mnt/ckpts"),
        ("/mnt/ckpts/", "file:///mnt/ckpts"),
        ("s3://bucket/exp", "s3://bucket/exp/"),
        ("s3://bucket/exp/sub", "s3://bucket/exp"),
        ("S3://bucket/exp", "s3://bucket/exp"),
        ("http://10.0.0.5/store", "http://10.0.0.5/store"),  # the caller named it
    ],
)
def test_a_row_under_the_opened_storage_is_used(recorded, opened):
    assert storage_of_row(recorded, opened) == recorded


@pytest.mark.parametrize(
    ("recorded", "opened"),
    [
        ("s3://bucket2/exp", "s3://bucket"),  # a prefix of the name is not the bucket
        ("/mnt/ckpts-evil", "/mnt/ckpts"),
        ("gs://attacker/models", "/mnt/ckpts"),
        ("http://169.254.169.254/latest/meta-data", "/mnt/ckpts"),
    ],
)
def test_any_other_row_url_is_refused_with_how_to_allow_it(recorded, opened):
    with pytest.raises(errors.StorageNotAllowed, match=ALLOWED_STORAGE_ENV) as info:
        storage_of_row(recorded, opened, uuid="0b7c")
    assert "0b7c" in str(info.value) and "storage_url=" in str(info.value)


def test_the_refusal_masks_a_password_in_the_row_url():
    with pytest.raises(errors.StorageNotAllowed) as info:
        storage_of_row("sftp://me:hunter2hunter2@host/x?token=abc123abc", "/mnt/ckpts")
    assert "hunter2hunter2" not in str(info.value) and "abc123abc" not in str(info.value)


def test_allow_list_argument_and_environment(monkeypatch):
    assert storage_of_row("gs://old/c", "/mnt", allowed=["gs://old"]) == "gs://old/c"
    with pytest.raises(errors.StorageNotAllowed):
        storage_of_row("gs://older/c", "/mnt", allowed=["gs://old"])
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, "s3://team, gs://old")
    assert storage_of_row("gs://old/c", "/mnt") == "gs://old/c"
    assert storage_of_row("s3://team/x", "/mnt") == "s3://team/x"
    with pytest.raises(errors.StorageNotAllowed):
        storage_of_row("s3://other/x", "/mnt")


def test_a_wildcard_never_allows_http_but_an_explicit_http_prefix_does():
    assert storage_of_row("s3://any/x", "/mnt", allowed=["*"]) == "s3://any/x"
    for url in ("http://internal/x", "https://internal/x"):
        with pytest.raises(errors.StorageNotAllowed, match="HTTP"):
            storage_of_row(url, "/mnt", allowed=["*"])
    assert storage_of_row("https://h/x/y", "/mnt", allowed=["https://h/x"]) == "https://h/x/y"


@pytest.mark.parametrize(
    "recorded", ["s3://my-bucket/ckpts", "gs://team/exp/1", "az://container/x", "abfs://c/p"]
)
def test_a_users_own_load_follows_a_bucket_url(recorded):
    """Issue 39, finding 1: a load for the user follows the bucket the registry recorded (read
    with the user's own credentials and endpoint); a server's reader (no ``follow``) does not."""
    assert storage_of_row(recorded, "/home/me/.local/share/ckptstore", follow=True) == recorded
    with pytest.raises(errors.StorageNotAllowed):
        storage_of_row(recorded, "/home/me/.local/share/ckptstore")


@pytest.mark.parametrize(
    "recorded",
    [
        "/etc/ckpts",  # a local path outside the storages this process knows
        "file:///root/.ssh",
        "http://169.254.169.254/latest/meta-data",
        "https://evil.example/ckpts",
        "sftp://attacker.example/ckpts",  # the URL would choose the host
        "hdfs://namenode:8020/x",
        "memory://x",
        "s3://bucket/x?endpoint_url=http://evil",  # a row never carries options
        "s3://user:pw@bucket/x",
        "s3://bucket/x#frag",
        "gs://host:1234/x",
    ],
)
def test_follow_never_goes_to_a_local_path_a_host_or_another_scheme(recorded):
    with pytest.raises(errors.StorageNotAllowed):
        storage_of_row(recorded, "/mnt/ckpts", follow=True)
