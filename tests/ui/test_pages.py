"""The UI's pages over a small real registry and local storage (Starlette TestClient): what
each page shows, sorting and filtering done by the database, retention reasons, the live
fragment, and downloads that verify against the manifest."""

from __future__ import annotations

import io
import os
import re
import tarfile

from ckptstore.checkpointing import format as ckpt_format
from ckptstore.checkpointing.checksums import crc32c_file
from tests._helpers.ui_client import verify_and_archive
from tests.ui.conftest import TRIALS


def _trial_order(html: str) -> list[int]:
    return [int(t) for t in re.findall(r'class="trial-row" data-trial="(\d+)"', html)]


def test_experiments_list_shows_counts_and_best(client, ui_env):
    html = client.get("/experiments").text
    assert f'href="/experiments/{ui_env.experiment_id}"' in html
    assert "random" in html and "val_loss" in html
    assert "COMPLETED 3" in html and "ERROR 1" in html and "ACTIVE 1" in html
    assert ">0.2<" in html  # the best val_loss of the whole search


def test_experiment_sorts_and_filters_in_sql(client, ui_env):
    base = f"/experiments/{ui_env.experiment_id}"
    ids = ui_env.trial_ids
    best = {t: b for t, (_s, _lr, b) in zip(ids, TRIALS, strict=True)}
    ascending = _trial_order(client.get(base, params={"sort": "best"}).text)
    assert ascending == sorted(ids, key=best.get)
    descending = _trial_order(client.get(base, params={"sort": "best", "dir": "desc"}).text)
    assert descending == sorted(ids, key=best.get, reverse=True)
    completed = _trial_order(client.get(base, params={"state": "COMPLETED", "sort": "best"}).text)
    assert completed == sorted([ids[0], ids[1], ids[3]], key=best.get)
    ranged = _trial_order(client.get(base, params={"min": "0.3", "max": "0.6"}).text)
    assert ranged == [t for t in ids if 0.3 <= best[t] <= 0.6]
    for key in ("id", "state", "best", "latest", "steps", "checkpoints"):
        for direction in ("asc", "desc"):
            shown = _trial_order(client.get(base, params={"sort": key, "dir": direction}).text)
            assert sorted(shown) == sorted(ids), (key, direction)
    latest_desc = _trial_order(client.get(base, params={"sort": "latest", "dir": "desc"}).text)
    assert latest_desc == sorted(ids, key=best.get, reverse=True)  # latest == best here
    html = client.get(base).text
    assert "learning_rate" in html and "<svg" in html  # searcher + hparam charts
    assert "val_loss vs learning_rate" in html


def test_experiment_bad_query_is_400(client, ui_env):
    base = f"/experiments/{ui_env.experiment_id}"
    for params in (
        {"min": "abc"},
        {"sort": "hparams; drop table"},
        {"state": "NOPE"},
        {"page": "0"},
    ):
        response = client.get(base, params=params)
        assert response.status_code == 400, params
        assert "Received" in response.text


def test_trial_page_curves_checkpoints_and_kept_by(client, ui_env):
    trial = ui_env.trial_ids[1]
    uuids = ui_env.uuids[trial]
    html = client.get(f"/trials/{trial}").text
    # One chart per metric; val_loss shares the loss chart as its validation line.
    assert html.count('class="curve"') == 2
    assert 'data-series="training"' in html and 'data-series="validation"' in html
    for uuid in uuids:
        assert uuid in html
    rows = dict(re.findall(r'data-uuid="([^"]+)">(.*?)</tr>', html, re.S))
    assert "latest (save_trial_latest=1)" in rows[uuids[-1]]
    assert "trial best by val_loss" in rows[uuids[-1]]
    assert "model mnist-cnn:1" in rows[uuids[-1]]
    assert "no rule: next GC deletes it" in rows[uuids[0]]
    assert 'data-active="0"' in html  # a finished trial does not poll


def test_trial_curve_options(client, ui_env):
    trial = ui_env.trial_ids[0]
    only_loss = client.get(f"/trials/{trial}", params={"m": "loss"}).text
    assert only_loss.count('class="curve"') == 1
    logged = client.get(f"/trials/{trial}", params={"m": "loss", "log": "1", "smooth": "0.6"})
    assert "(log scale)" in logged.text
    assert client.get(f"/trials/{trial}", params={"smooth": "2"}).status_code == 400


def test_live_fragment_and_stamp_follow_new_reports(client, ui_env):
    trial = ui_env.trial_ids[4]  # ACTIVE
    page = client.get(f"/trials/{trial}").text
    assert 'data-active="1"' in page and "/static/live.js" in page
    before = client.get(f"/trials/{trial}/stamp").json()["stamp"]
    with ui_env.env.registry() as registry:
        registry.report_metrics(trial, "validation", 40, {"val_loss": 0.01})
    after = client.get(f"/trials/{trial}/stamp").json()["stamp"]
    assert after != before
    uuid = ui_env.env.save(trial, 40, experiment_id=ui_env.experiment_id)
    assert client.get(f"/trials/{trial}/stamp").json()["stamp"] != after
    live = client.get(f"/trials/{trial}/live").text
    assert live.startswith('<div id="live"') and uuid in live


def test_checkpoint_page_manifest_verify_and_archive(client, ui_env):
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    html = client.get(f"/checkpoints/{uuid}").text
    for name in ("model.keras", "extra/notes.txt", "saved_model/x.pb", "metadata.json"):
        assert name in html
    out = ui_env.env.workdir + "/extracted"
    assert f"{uuid}/MANIFEST.json" in verify_and_archive(client, uuid, out)
    manifest = ckpt_format.parse_manifest(open(f"{out}/{uuid}/MANIFEST.json", "rb").read(), uuid)
    checked = ckpt_format.verify_files(f"{out}/{uuid}", manifest)
    assert set(checked) == {k for k in manifest["files"] if not k.endswith("/")}


def test_verify_reports_a_damaged_checkpoint(client, ui_env):
    uuid = ui_env.uuids[ui_env.trial_ids[0]][0]
    ui_env.env.corrupt(uuid, "model.keras")  # the file, or its first chunk (deduplicated)
    html = client.get(f"/checkpoints/{uuid}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    result = client.post(f"/checkpoints/{uuid}/verify", data={"csrf": csrf}).text
    assert 'class="bad"' in result and "model.keras" in result
    # The archive stops instead of handing out a complete-looking tar with a bad file.
    try:
        body = client.get(f"/checkpoints/{uuid}/archive.tar").content
    except Exception:  # noqa: BLE001 - the stream was cut: the expected outcome
        return
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert f"{uuid}/MANIFEST.json" not in tar.getnames()


def _archive(client, uuid: str) -> bytes:
    """The archive's bytes, or b"" when the stream was cut (the client gets no archive)."""
    try:
        return client.get(f"/checkpoints/{uuid}/archive.tar").content
    except Exception:  # noqa: BLE001 - the stream was cut
        return b""


def test_archive_with_a_verify_key_holds_only_signed_files(client, ui_env, monkeypatch):
    """With CKPTSTORE_VERIFY_KEY in the UI's environment its archive is a verified download
    too: an unsigned checkpoint, or a file altered after signing, cuts the stream before
    the file joins it; a signed one archives whole."""
    from ckptstore.checkpointing import signing
    from tests.checkpointing._helpers import ec_key_pair

    unsigned, signed = ui_env.uuids[ui_env.trial_ids[0]][-2:]
    key, pub = ec_key_pair(ui_env.env.workdir)
    assert ui_env.env.run("checkpoint", "sign", signed, "--key", key).exit_code == 0
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    with tarfile.open(fileobj=io.BytesIO(_archive(client, signed))) as tar:
        assert f"{signed}/{signing.SIGNATURE_NAME}" in tar.getnames()
    assert f"{unsigned}/".encode() not in _archive(client, unsigned)  # not one member
    # a file whole in the folder (saved_model/ on a local store, deduplicated or not)
    altered = "saved_model/x.pb"
    local = f"{ui_env.env.storage_url}/{signed}/{altered}"
    os.chmod(local, 0o644)
    with open(local, "r+b") as f:  # same size; the manifest's crc32c made to match
        f.write(b"X")
    manifest = ckpt_format.parse_manifest(
        open(f"{ui_env.env.storage_url}/{signed}/MANIFEST.json", "rb").read(), signed
    )
    manifest["files"][altered]["crc32c"] = crc32c_file(local)
    manifest_file = f"{ui_env.env.storage_url}/{signed}/MANIFEST.json"
    os.chmod(manifest_file, 0o644)
    with open(manifest_file, "wb") as f:
        f.write(ckpt_format.manifest_bytes(manifest))
    assert f"{signed}/{altered}".encode() not in _archive(client, signed)


def test_models_and_writes(client, ui_env):
    assert "mnist-cnn" in client.get("/models").text
    html = client.get("/models/mnist-cnn").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    form = {"csrf": csrf, "model": "mnist-cnn"}
    assert (
        client.post(
            "/model-actions/alias", data={**form, "alias": "prod", "version": "1"}
        ).status_code
        == 200
    )
    assert (
        client.post(
            "/model-actions/alias", data={**form, "alias": "prod", "version": "2"}
        ).status_code
        == 200
    )
    client.post("/model-actions/label", data={**form, "label": "ready"})
    client.post("/model-actions/note", data={**form, "version": "2", "note": "best so far"})
    with ui_env.env.registry() as registry:
        model = registry.get_model("mnist-cnn")
        assert model.get_version("prod").version == 2  # moved, not copied
        assert model.get_version(1).aliases == []
        assert model.labels == ["vision", "ready"]
        assert model.get_version(2).notes == "best so far"
    bad = client.post("/model-actions/alias", data={**form, "alias": "x", "version": "nine"})
    assert bad.status_code == 400


def test_register_checkpoint_as_model_version(client, ui_env):
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    html = client.get(f"/checkpoints/{uuid}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    response = client.post(
        f"/checkpoints/{uuid}/register", data={"csrf": csrf, "model": "new-model"}
    )
    assert response.status_code == 200 and uuid in response.text
    with ui_env.env.registry() as registry:
        assert registry.get_model("new-model").get_version(1).checkpoint.uuid == uuid


def test_checkpoints_list_pages_and_filters(client, ui_env):
    html = client.get("/checkpoints", params={"trial": ui_env.trial_ids[2]}).text
    assert sorted(re.findall(r'href="/checkpoints/([0-9a-f-]{36})"', html)) == sorted(
        ui_env.uuids[ui_env.trial_ids[2]]
    )
    assert client.get("/checkpoints", params={"state": "BOGUS"}).status_code == 400


def test_gc_settings_follow_how_the_trials_ran():
    from ckptstore.ui.kept import gc_settings

    trial_class = {
        "entrypoint": "model_def:MyTrial",
        "hyperparameters": {"global_batch_size": 32},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 10}},
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/x", "save_trial_best": 3},
    }
    assert gc_settings(trial_class) == {
        "save_experiment_best": 0,
        "save_trial_best": 3,
        "save_trial_latest": 1,
    }
    script = dict(trial_class, entrypoint="python3 train.py", checkpoint_storage="/x")
    assert gc_settings(script) is None  # a script without GC keys ran without a policy
    assert gc_settings(None) is None and gc_settings({}) is None


def test_trial_page_shows_tensorboard_folder_and_command(client, ui_env):
    trial = ui_env.trial_ids[0]
    folder = f"{ui_env.env.storage_url}/tensorboard/{trial}/train"
    import os

    os.makedirs(folder)
    with open(f"{folder}/events.out.tfevents.1.host", "wb") as f:
        f.write(b"\0" * 16)
    html = client.get(f"/trials/{trial}").text
    assert f"tensorboard --logdir {ui_env.env.storage_url}/tensorboard/{trial}" in html
    other = client.get(f"/trials/{ui_env.trial_ids[1]}").text
    assert "No TensorBoard logs in storage" in other


def test_experiment_charts_follow_new_metrics(client, ui_env):
    path = f"/experiments/{ui_env.experiment_id}"
    trial = ui_env.trial_ids[4]
    assert f"val_loss: trial {trial}, 0.7<" in client.get(path).text
    with ui_env.env.registry() as registry:
        registry.report_metrics(trial, "validation", 40, {"val_loss": 0.0125})
    html = client.get(path).text  # the cached charts are keyed by the metrics' stamp
    assert f"val_loss: trial {trial}, 0.0125<" in html


def test_explicit_storage_wins_over_the_recorded_url(ui_env, tmp_path, monkeypatch):
    import shutil

    from starlette.testclient import TestClient

    from ckptstore.ui.app import create_app

    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    copy = tmp_path / "copy"
    shutil.copytree(ui_env.env.storage_url, copy)  # the whole store: chunks are shared
    ui_env.env.corrupt(uuid, "model.keras")  # the recorded storage now has a damaged copy

    def verify(settings) -> str:
        with TestClient(create_app(settings)) as client:
            html = client.get(f"/checkpoints/{uuid}").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
            return client.post(f"/checkpoints/{uuid}/verify", data={"csrf": csrf}).text

    assert 'class="ok"' in verify(ui_env.settings(storage_url=str(copy), explicit_storage=True))
    # The row's URL is read only when allowed (tests/ui/test_row_storage.py: refused otherwise).
    monkeypatch.setenv("CKPTSTORE_ALLOWED_STORAGE", ui_env.env.storage_url)
    assert 'class="bad"' in verify(ui_env.settings(storage_url=str(copy)))  # the row's URL


def test_categorical_hparams_are_summarised(client, ui_env):
    html = client.get(f"/experiments/{ui_env.experiment_id}").text
    table = re.search(r'data-hparam="optimizer">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(
        r"<tr><td>(\w+)</td><td class=\"num\">(\d+)</td><td class=\"num\">([\d.]+)<", table
    )
    # adam: trials 1, 3, 5 (best 0.5, 0.9, 0.7); sgd: trials 2, 4 (best 0.2, 0.35); best first.
    assert rows == [("sgd", "2", "0.2"), ("adam", "3", "0.5")]


def test_deduplicated_checkpoint_verifies_and_archives_as_ordinary_files(client, ui_env, tmp_path):
    """A format-2 checkpoint (content in shared blobs) is verified and archived by the UI as
    ordinary files, byte-identical to what was saved."""
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.registry import Registry

    data = os.urandom(3 * 4096 + 5)
    src = tmp_path / "src"
    (src / "weights").mkdir(parents=True)
    (src / "weights" / "w.bin").write_bytes(data)
    with Registry(ui_env.env.registry_url) as registry:
        with CheckpointContext(
            ui_env.env.storage_url,
            index=registry,
            trial_id=ui_env.trial_ids[0],
            dedup=True,
            dedup_chunk_bytes=4096,
        ) as ctx:
            uuid = ctx.upload(str(src), {"steps_completed": 999})
    html = client.get(f"/checkpoints/{uuid}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    verified = client.post(f"/checkpoints/{uuid}/verify", data={"csrf": csrf})
    assert 'class="ok"' in verified.text, verified.text
    response = client.get(f"/checkpoints/{uuid}/archive.tar")
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        assert tar.extractfile(f"{uuid}/weights/w.bin").read() == data
