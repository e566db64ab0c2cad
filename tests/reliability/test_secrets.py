"""Credentials never appear in logs, error messages, reprs, metadata.json or the registry.

A save / load / list / failing call runs with credentials while every logger (ckptstore,
botocore, boto3, s3transfer, urllib3, azure) logs at DEBUG into one buffer; then the buffer,
the exception texts, the reprs, every stored ``metadata.json`` and every registry row are
searched for the secret strings.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import urllib.parse

import pytest
import sqlalchemy as sa

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage

pytestmark = pytest.mark.timeout(180)

LOGGERS = ("", "ckptstore", "botocore", "boto3", "s3transfer", "urllib3", "azure")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception as exc:  # noqa: BLE001 - a broken record must not hide others
            self.lines.append(f"<unformattable record: {exc!r}>")


@pytest.fixture()
def capture():
    handler = _Capture()
    saved = {}
    for name in LOGGERS:
        log = logging.getLogger(name)
        saved[name] = log.level
        log.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _registry_dump(registry_url: str) -> str:
    engine = sa.create_engine(registry_url)
    meta = sa.MetaData()
    meta.reflect(engine)
    out = []
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            out += [repr(tuple(row)) for row in conn.execute(sa.select(table))]
    engine.dispose()
    return "\n".join(out)


def _exercise(storage, registry_url, tmp_path) -> list[str]:
    """Save, load, list, and provoke errors; returns error texts and reprs seen."""
    texts: list[str] = [repr(storage), str(storage.url)]
    registry = Registry(registry_url)
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "w.bin").write_bytes(b"w" * 5000)
    with CheckpointContext(storage, index=registry, trial_id=1) as ctx:
        texts.append(repr(ctx))
        uuid = ctx.upload(src, {"steps_completed": 1})
        ctx.download(uuid, tmp_path / "dl")
        texts.append(repr(ctx.get_metadata(uuid)))
        texts.append(repr(registry.list_checkpoints(trial_id=1)))
        texts.append(storage.read_bytes(f"{uuid}/metadata.json").decode())
        for bad in (
            lambda: ctx.download("00000000-0000-0000-0000-000000000000", tmp_path / "x"),
            lambda: storage.read_bytes("missing/object"),
            lambda: ctx.get_metadata("../x"),
        ):
            try:
                bad()
            except errors.CkptstoreError as exc:
                texts += [str(exc), repr(exc), str(exc.__cause__ or "")]
    texts.append(repr(registry))
    registry.close()
    texts.append(_registry_dump(registry_url))
    return texts


def _assert_absent(secrets, capture: _Capture, texts: list[str]) -> None:
    assert capture.lines, "nothing was logged: the capture is not working"
    haystacks = {
        "logs": "\n".join(capture.lines),
        "errors/reprs/metadata/registry": "\n".join(texts),
    }
    for where, text in haystacks.items():
        for secret in secrets:
            assert secret not in text, f"a secret ({secret[:4]}...) appears in {where}"


def test_s3_keys_never_leak(s3_server, storage_url_factory, tmp_path, capture):
    url = storage_url_factory("s3")
    bucket = url.split("/")[2]
    access_key = "AKIAZZLEAKTESTKEY0042"
    secret_key = "zzLeakTest/Secret+Key0000000000000000042"
    storage = open_storage(
        {
            "type": "s3",
            "bucket": bucket,
            "prefix": "root",
            "access_key": access_key,
            "secret_key": secret_key,
            "endpoint_url": s3_server.endpoint,
        }
    )
    texts = _exercise(storage, f"sqlite:///{tmp_path / 'reg.db'}", tmp_path)
    # a bucket that does not exist, with the same keys
    bad = open_storage(
        f"s3://no-such-bucket-{bucket}/p",
        access_key=access_key,
        secret_key=secret_key,
        endpoint_url=s3_server.endpoint,
    )
    try:
        bad.read_bytes("x")
    except errors.CkptstoreError as exc:
        texts += [str(exc), repr(exc)]
    texts.append(repr(bad))
    bad.close()
    storage.close()
    _assert_absent([secret_key, access_key], capture, texts)


def _azure_sas(container: str, endpoint: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from tests.servers.emulators import AZURITE_ACCOUNT, AZURITE_KEY

    return generate_container_sas(
        AZURITE_ACCOUNT,
        container,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True),
        expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1),
    )


@pytest.mark.parametrize("how", ["connection_string", "sas_credential"])
def test_azure_credentials_never_leak(azure_server, storage_url_factory, tmp_path, capture, how):
    from tests.servers.emulators import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string

    url = storage_url_factory("azure")
    container = urllib.parse.urlsplit(url).netloc
    if how == "connection_string":
        secret = AZURITE_KEY
        secrets = [secret]
        storage = open_storage(
            {
                "type": "azure",
                "container": container,
                "prefix": "root",
                "connection_string": azurite_connection_string(azure_server.endpoint),
            }
        )
    else:
        sas = _azure_sas(container, azure_server.endpoint)
        signature = urllib.parse.parse_qs(sas)["sig"][0]
        secrets = [signature, urllib.parse.quote(signature, safe="")]
        env = os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
        try:
            storage = open_storage(
                {
                    "type": "azure",
                    "container": container,
                    "prefix": "root",
                    "account_url": f"{azure_server.endpoint}/{AZURITE_ACCOUNT}",
                    "credential": sas,
                }
            )
        finally:
            if env is not None:
                os.environ["AZURE_STORAGE_CONNECTION_STRING"] = env
    texts = _exercise(storage, f"sqlite:///{tmp_path / 'reg.db'}", tmp_path)
    storage.close()
    _assert_absent(secrets, capture, texts)
