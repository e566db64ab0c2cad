"""The UI's safety rules: the token on every route, Host checks on loopback, CSRF-checked
POSTs, read-only mode, traversal-shaped identifiers, and no secret in any page."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from ckptstore import errors
from ckptstore.cli.main import cli
from ckptstore.ui.app import create_app, routes
from ckptstore.ui.settings import check_bind
from tests._helpers.ports import free_port

TOKEN = "a-long-enough-test-token-1234"


def _concrete_paths(ui_env) -> list[tuple[str, str]]:
    """(method, path) for every route, with real ids filled in."""
    trial = ui_env.trial_ids[0]
    values = {
        "experiment_id": str(ui_env.experiment_id),
        "trial_id": str(trial),
        "uuid": ui_env.uuids[trial][-1],
        "name": "mnist-cnn",
        "action": "alias",
    }
    out = []
    for route in routes():
        if isinstance(route, Mount):
            out.append(("GET", "/static/ui.css"))
            continue
        assert isinstance(route, Route)
        path = re.sub(r"{(\w+)(:\w+)?}", lambda m: values[m.group(1)], route.path)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                out.append((method, path))
    return out


def test_every_route_needs_the_token(ui_env):
    app = create_app(ui_env.settings(token=TOKEN), bind_host="0.0.0.0")
    with TestClient(app, follow_redirects=False) as client:
        paths = _concrete_paths(ui_env)
        assert len(paths) >= 15
        for method, path in paths:
            response = client.request(method, path)
            assert response.status_code == 401, (method, path)
            assert "mnist" not in response.text and ui_env.env.storage_url not in response.text
            wrong = client.request(method, path, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
        for method, path in paths:
            if method == "GET":
                ok = client.get(path, headers={"authorization": f"Bearer {TOKEN}"})
                assert ok.status_code in (200, 307), path
        # ?token= logs a browser in with an HttpOnly cookie and drops the token from the URL.
        login = client.get(f"/models?token={TOKEN}")
        assert login.status_code == 303 and login.headers["location"] == "/models"
        assert "httponly" in login.headers["set-cookie"].lower()
        assert client.get("/models").status_code == 200  # the cookie now carries it


def test_non_loopback_bind_needs_a_token(ui_env, monkeypatch):
    with pytest.raises(errors.InvalidConfig, match="--token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(errors.InvalidConfig, match="16 characters"):
        check_bind("0.0.0.0", "short")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", TOKEN)
    monkeypatch.delenv("CKPTSTORE_UI_TOKEN", raising=False)
    env = ui_env.env
    result = CliRunner().invoke(
        cli,
        ["--registry", env.registry_url, "--storage", env.storage_url, "ui", "--host", "0.0.0.0"],
    )
    assert result.exit_code == 2, result.output  # refused before anything listens
    assert "--token" in result.output


def test_loopback_server_refuses_foreign_host_headers(client):
    assert client.get("/models").status_code == 200
    rebinding = client.get("/models", headers={"host": "evil.example:8765"})
    assert rebinding.status_code == 400


def test_security_headers(client):
    response = client.get("/experiments")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"


def _csrf(client, path: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', client.get(path).text).group(1)


def test_posts_without_csrf_are_refused(client, ui_env):
    uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
    form = {"model": "mnist-cnn", "alias": "prod", "version": "1", "label": "x", "note": "n"}
    for path in (
        "/model-actions/alias",
        "/model-actions/label",
        "/model-actions/note",
        f"/checkpoints/{uuid}/register",
        f"/checkpoints/{uuid}/verify",
    ):
        assert client.post(path, data=form).status_code == 403, path
        assert client.post(path, data={**form, "csrf": "guess"}).status_code == 403, path
    token = _csrf(client, "/models/mnist-cnn")
    cross = client.post(
        "/model-actions/alias",
        data={**form, "csrf": token},
        headers={"origin": "https://evil.example", "sec-fetch-site": "cross-site"},
    )
    assert cross.status_code == 403
    with ui_env.env.registry() as registry:
        model = registry.get_model("mnist-cnn")
        assert model.labels == ["vision"]
        assert all(v.aliases == [] and v.notes == "" for v in model.list_versions())
        assert [v.version for v in model.list_versions()] == [1, 2]
    assert client.get("/model-actions/alias").status_code == 405  # writes are POST only


def test_read_only_refuses_writes_and_hides_forms(ui_env):
    with TestClient(create_app(ui_env.settings(read_only=True))) as client:
        html = client.get("/models/mnist-cnn").text
        assert 'id="set-alias"' not in html and "read-only" in html
        uuid = ui_env.uuids[ui_env.trial_ids[0]][-1]
        token = _csrf(client, f"/checkpoints/{uuid}")  # the verify form stays
        response = client.post(
            "/model-actions/alias",
            data={"csrf": token, "model": "mnist-cnn", "alias": "prod", "version": "1"},
        )
        assert response.status_code == 403
        assert client.post(f"/checkpoints/{uuid}/verify", data={"csrf": token}).status_code == 200
    with ui_env.env.registry() as registry:
        assert registry.get_model("mnist-cnn").get_version(1).aliases == []


@pytest.mark.parametrize(
    "path",
    [
        "/checkpoints/..",
        "/checkpoints/..%2F..%2Fsecret.txt",
        "/checkpoints/%2E%2E",
        "/checkpoints/..%5C..%5Csecret.txt",
        "/checkpoints/secret.txt",
        "/checkpoints/..%00",
        "/checkpoints/../secret.txt/archive.tar",
        "/checkpoints/..%2Fsecret.txt/archive.tar",
        "/checkpoints/%2Fetc%2Fpasswd/archive.tar",
        "/models/..%2F..%2Fsecret.txt",
        "/models/../../secret.txt",
        "/trials/..%2F1",
        "/static/..%2F..%2Fsecret.txt",
        "/static/../app.py",
    ],
)
def test_traversal_shaped_identifiers_never_reach_a_file(shared_ui_env, path):
    ui_env = shared_ui_env
    secret = b"TOP-SECRET-CONTENT"
    outside = os.path.join(os.path.dirname(ui_env.env.storage_url), "secret.txt")
    with open(outside, "wb") as f:
        f.write(secret)
    inside = os.path.join(ui_env.env.storage_url, "secret.txt")
    with open(inside, "wb") as f:
        f.write(secret)
    # Sent as is (an HTTP client would normalize the dot segments away before sending).
    status, body = _raw_get(create_app(ui_env.settings()), path)
    assert status in (400, 404), (path, status)
    assert secret not in body


def _raw_get(app, raw_path: str) -> tuple[int, bytes]:
    """GET ``raw_path`` straight through the ASGI app, exactly as a server would pass it."""
    status, _headers, body = _raw_request(app, raw_path)
    return status, body


def _raw_request(app, raw_path: str, query: str = "") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a GET of ``raw_path?query`` sent straight to the ASGI app
    (an HTTP client would read ``//host/x`` as a host, not a path)."""
    from urllib.parse import unquote

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"127.0.0.1:8765")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8765),
        "state": {},
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body


def test_secrets_in_configs_and_urls_never_appear(ui_env):
    secret = "SECRETKEY123"
    with ui_env.env.registry() as registry:
        exp = registry.create_experiment(
            "s3-search",
            config={
                "searcher": {"name": "single", "metric": "val_loss"},
                "checkpoint_storage": {
                    "type": "s3",
                    "bucket": "b",
                    "access_key": "AKIAEXAMPLE",
                    "secret_key": secret,
                    "endpoint_url": f"http://user:{secret}@127.0.0.1:9/?sig={secret}",
                },
            },
        )
    settings = ui_env.settings(storage_url=ui_env.env.storage_url)
    with TestClient(create_app(settings)) as client:
        for path in ("/experiments", f"/experiments/{exp}"):
            html = client.get(path).text
            assert secret not in html and "AKIAEXAMPLE" not in html
        assert "secret_key: &#39;***&#39;" in client.get(f"/experiments/{exp}").text


def _serve(args: list[str], env_vars: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptstore.cli.main", *args, "ui", "--port", str(port)],
        env={**os.environ, **env_vars},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, port


def _http_status(url: str, headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _first_status(proc: subprocess.Popen, url: str) -> int:
    """The status of ``url`` once the server started by :func:`_serve` answers."""
    import time
    import urllib.error

    deadline = time.monotonic() + 60
    while True:
        try:
            return _http_status(url)
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "ckptstore ui did not start"
            time.sleep(0.2)


def test_the_command_serves_with_token_from_the_environment(shared_ui_env):
    env = shared_ui_env.env
    proc, port = _serve(
        ["--registry", env.registry_url, "--storage", env.storage_url],
        {"CKPTSTORE_UI_TOKEN": TOKEN, "PYTHONPATH": os.getcwd()},
    )
    try:
        status = _first_status(proc, f"http://127.0.0.1:{port}/models")
        assert status == 401
        ok = _http_status(f"http://127.0.0.1:{port}/models", {"Authorization": f"Bearer {TOKEN}"})
        assert ok == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_command_reads_s3_through_a_json_storage_blocks_options(
    tmp_path, s3_server, storage_url_factory
):
    """``--storage '{"type": "s3", ..., "endpoint_url": ...}'``: the UI opens the bucket with
    the block's endpoint and keys (the server's environment has no AWS settings; before, the
    UI got the block's URL alone and could not reach the bucket)."""
    import json
    import urllib.request

    from tests.cli.helpers import make_env

    url = storage_url_factory("s3")  # s3://bucket/root on moto, written with the env's keys
    env = make_env(tmp_path, url)
    uuid = env.save(1, 10, files={"model.keras": b"weights", "notes/readme.txt": b"hi"})
    aws = s3_server.env
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    block = {
        "type": "s3",
        "bucket": bucket,
        "prefix": prefix,
        "endpoint_url": aws["AWS_ENDPOINT_URL"],
        "access_key": aws["AWS_ACCESS_KEY_ID"],
        "secret_key": aws["AWS_SECRET_ACCESS_KEY"],
        "region": aws["AWS_DEFAULT_REGION"],
    }
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    server_env["PYTHONPATH"] = os.getcwd()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptstore.cli.main", "--registry", env.registry_url,
         "--storage", json.dumps(block), "ui", "--port", str(port)],
        env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        page = f"http://127.0.0.1:{port}/checkpoints/{uuid}"
        assert _first_status(proc, page) == 200
        with urllib.request.urlopen(page) as response:
            html = response.read().decode()
        assert "notes/readme.txt" in html and aws["AWS_SECRET_ACCESS_KEY"] not in html
        with urllib.request.urlopen(f"{page}/archive.tar") as response:
            archive = response.read()
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert tar.extractfile(tar.getmember(f"{uuid}/model.keras")).read() == b"weights"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_any_identifier_in_a_url_is_a_clean_400_or_404(shared_ui_env):
    from urllib.parse import quote

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    app = create_app(shared_ui_env.settings())
    known = {u for uuids in shared_ui_env.uuids.values() for u in uuids}
    pieces = st.sampled_from(
        ["..", ".", "/", "\\\\", "%2F", "%2e", "\\x00", "~", "secret.txt", ":"]
    )
    ident = st.lists(
        st.one_of(pieces, st.text(min_size=1, max_size=8)), min_size=1, max_size=6
    ).map("".join)

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        ident,
        st.sampled_from(
            ["/checkpoints/{}", "/checkpoints/{}/archive.tar", "/models/{}", "/trials/{}"]
        ),
    )
    def check(value: str, template: str) -> None:
        if value in known or value == "mnist-cnn":
            return
        status, body = _raw_get(app, template.format(quote(value, safe="/%\\\\")))
        assert status in (400, 404, 307), (value, template, status)
        assert b"TOP-SECRET" not in body and b"Traceback" not in body

    check()


def test_websockets_are_refused(shared_ui_env):
    from starlette.websockets import WebSocketDisconnect

    with TestClient(create_app(shared_ui_env.settings(token=TOKEN))) as client:
        with pytest.raises(WebSocketDisconnect):
            with client.websocket_connect("/experiments") as ws:
                ws.receive_text()


@pytest.mark.parametrize(
    "path", ["//evil.example/x", "///evil.example/x", "/\\evil.example/x", "/%2F/evil.example/x"]
)
def test_token_login_redirects_only_to_a_same_origin_path(ui_env, path):
    """Finding 6 of issue 27: after ``?token=`` the redirect drops the token but must never
    become a protocol-relative URL (``//host``) a browser would follow to another site."""
    app = create_app(ui_env.settings(token=TOKEN), bind_host="0.0.0.0")
    status, headers, _body = _raw_request(app, path, query=f"token={TOKEN}&page=2")
    assert status == 303
    location = headers["location"]
    assert location.startswith("/") and not location.startswith(("//", "/\\", "/%5C", "/%5c"))
    assert location.endswith("?page=2") and "evil.example" in location  # kept as a local path
