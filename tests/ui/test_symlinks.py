"""Issue 27, finding 3: on a local store the UI never follows a symbolic link out of the
checkpoint (or trial log folder) it serves. Whoever can write the store could otherwise read
any file the UI process can (``/proc/self/environ``: the UI token, cloud keys) through a
checkpoint's archive download or a trial's log on its page."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from starlette.testclient import TestClient

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext
from ckptstore.checkpointing import format as ckpt_format
from ckptstore.checkpointing.checksums import crc32c_file
from ckptstore.storage_backends import open_storage
from ckptstore.ui.app import create_app

FAKE_SECRET = b"AWS_SECRET_ACCESS_KEY=fake-secret-from-outside-the-store\n"


def _outside_file(ui_env) -> str:
    path = os.path.join(ui_env.env.workdir, "outside-the-store.env")
    with open(path, "wb") as f:
        f.write(FAKE_SECRET)
    return path


def _link_into_checkpoint(ui_env, uuid: str, rel: str, target: str) -> None:
    """Replace ``rel`` of a committed checkpoint by a link to ``target`` and rewrite the
    manifest to match it (an entry of a file whole in the folder, also where the file was
    chunks), as an attacker who can write the store would."""
    folder = os.path.join(ui_env.env.storage_url, uuid)
    link = os.path.join(folder, rel)
    if os.path.lexists(link):
        os.remove(link)
    os.makedirs(os.path.dirname(link), exist_ok=True)  # a chunked file has no folder here
    os.symlink(target, link)
    manifest_path = os.path.join(folder, ckpt_format.MANIFEST_NAME)
    with open(manifest_path, "rb") as f:
        manifest = json.load(f)
    manifest["files"][rel] = {"size": os.path.getsize(link), "crc32c": crc32c_file(link)}
    with open(manifest_path, "wb") as f:
        f.write(ckpt_format.manifest_bytes(manifest))


def test_archive_download_refuses_a_link_out_of_the_checkpoint(ui_env):
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    _link_into_checkpoint(ui_env, uuid, "extra/notes.txt", _outside_file(ui_env))
    with TestClient(create_app(ui_env.settings()), raise_server_exceptions=False) as client:
        try:
            body = client.get(f"/checkpoints/{uuid}/archive.tar").content
        except errors.InvalidStoragePath:  # the stream aborted: the client gets no archive
            body = b""
    assert FAKE_SECRET not in body
    with pytest.raises(tarfile.ReadError):  # never a complete-looking archive
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tar:
            tar.getmembers()


def test_archive_of_a_checkpoint_with_a_link_inside_it_still_downloads(ui_env):
    """A link that stays inside its checkpoint is no escape: served as the file it names."""
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    # saved_model/ is whole in the folder on a local store (deduplicated or not)
    inside = os.path.join(ui_env.env.storage_url, uuid, "saved_model", "x.pb")
    _link_into_checkpoint(
        ui_env,
        uuid,
        "extra/notes.txt",
        os.path.relpath(inside, os.path.join(ui_env.env.storage_url, uuid, "extra")),
    )
    with TestClient(create_app(ui_env.settings())) as client:
        response = client.get(f"/checkpoints/{uuid}/archive.tar")
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:") as tar:
        notes = tar.extractfile(f"{uuid}/extra/notes.txt").read()
    with open(inside, "rb") as f:
        assert notes == f.read()


def test_trial_page_never_shows_a_log_linked_from_outside(ui_env):
    trial = ui_env.trial_ids[0]
    logs = os.path.join(ui_env.env.storage_url, "logs", str(trial))
    os.makedirs(logs)
    with open(os.path.join(logs, "runner_host_1.log"), "w") as f:
        f.write("epoch 1 done\n")
    os.symlink(_outside_file(ui_env), os.path.join(logs, "runner_host_2.log"))
    with TestClient(create_app(ui_env.settings())) as client:
        response = client.get(f"/trials/{trial}")
    assert response.status_code == 200
    assert FAKE_SECRET.decode().strip() not in response.text
    assert "epoch 1 done" in response.text  # the other log is still shown
    assert "runner_host_2.log" in response.text and "symbolic link" in response.text


def test_restore_path_refuses_a_link_out_of_the_checkpoint(ui_env):
    """The readers (restore_path, and so load_checkpoint_model) hand a local checkpoint's own
    folder to Keras: a link out of it is refused before anything reads it."""
    uuid = ui_env.uuids[ui_env.trial_ids[1]][-1]
    _link_into_checkpoint(ui_env, uuid, "extra/notes.txt", _outside_file(ui_env))
    storage = open_storage(ui_env.env.storage_url)
    with CheckpointContext(storage) as ctx:
        with pytest.raises(errors.InvalidStoragePath, match="symbolic link"):
            with ctx.restore_path(uuid):
                pass
