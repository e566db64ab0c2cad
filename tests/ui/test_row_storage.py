"""Issue 27, finding 2: a registry row's ``storage_url`` does not decide where the UI reads a
checkpoint from. A row pointing at ``http://<internal host>/`` must not make the server send a
single request there; a row pointing at another storage is read only when it is allowed."""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from ckptstore.checkpointing.blobs import BLOBS_DIR
from ckptstore.checkpointing.row_storage import ALLOWED_STORAGE_ENV
from ckptstore.registry import schema
from ckptstore.ui.app import create_app


@pytest.fixture
def internal_host() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server standing for a host inside the network; yields its URL and the
    paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/store", asked
    finally:
        server.shutdown()
        server.server_close()


def _point_row_at(ui_env, uuid: str, url: str) -> None:
    """What whoever can write the registry does: change the row's storage URL."""
    with ui_env.env.registry() as registry:
        with registry._db.engine.begin() as conn:
            conn.execute(
                schema.checkpoints.update()
                .where(schema.checkpoints.c.uuid == uuid)
                .values(storage_url=url)
            )


def test_a_row_pointing_at_an_internal_http_host_sends_it_nothing(
    ui_env, internal_host, monkeypatch
):
    url, asked = internal_host
    monkeypatch.setenv(ALLOWED_STORAGE_ENV, "*")  # even "any storage" does not cover HTTP
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    _point_row_at(ui_env, uuid, url)
    with TestClient(create_app(ui_env.settings())) as client:
        page = client.get(f"/checkpoints/{uuid}")
        archive = client.get(f"/checkpoints/{uuid}/archive.tar")
    assert asked == []
    assert page.status_code == 200 and ALLOWED_STORAGE_ENV in page.text
    assert archive.status_code == 400 and "HTTP(S) is never a storage" in archive.text


def test_a_row_pointing_at_another_storage_is_read_only_when_allowed(ui_env, monkeypatch):
    monkeypatch.delenv(ALLOWED_STORAGE_ENV, raising=False)
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    other = os.path.join(ui_env.env.workdir, "other-store")
    shutil.copytree(os.path.join(ui_env.env.storage_url, uuid), os.path.join(other, uuid))
    shutil.copytree(  # a deduplicated checkpoint moves with its store's chunks
        os.path.join(ui_env.env.storage_url, BLOBS_DIR), os.path.join(other, BLOBS_DIR)
    )
    shutil.rmtree(os.path.join(ui_env.env.storage_url, uuid))
    _point_row_at(ui_env, uuid, f"file://{other}")
    with TestClient(create_app(ui_env.settings())) as client:
        refused = client.get(f"/checkpoints/{uuid}/archive.tar")
        assert refused.status_code == 400 and other in refused.text
        monkeypatch.setenv(ALLOWED_STORAGE_ENV, other)
        allowed = client.get(f"/checkpoints/{uuid}/archive.tar")
    assert allowed.status_code == 200 and f"{uuid}/model.keras".encode() in allowed.content


def test_the_ui_never_follows_a_row_to_a_bucket_it_was_not_opened_with(
    ui_env, monkeypatch, storage_url_factory
):
    """Issue 39: a user's own load follows a row's S3 bucket; a server does not: the UI reads
    only the storages it was opened with or allowed, even a bucket the credentials reach."""
    monkeypatch.delenv(ALLOWED_STORAGE_ENV, raising=False)
    bucket = storage_url_factory("s3")  # a bucket this process's credentials can read
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    _point_row_at(ui_env, uuid, bucket)
    with TestClient(create_app(ui_env.settings())) as client:
        refused = client.get(f"/checkpoints/{uuid}/archive.tar")
    assert refused.status_code == 400 and ALLOWED_STORAGE_ENV in refused.text
