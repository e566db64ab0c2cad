"""The one masking rule (:mod:`ckptstore.masking`): what counts as a secret, in keys, in
``NAME=value`` text, in URLs; and that errors and the SDK log filter use it."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptstore import errors, masking

SECRET = "s3cr3tVALUE42"


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "db_password",
        "PASSWD",
        "secret",
        "client_secret",
        "token",
        "HF_TOKEN",
        "accessToken",
        "api_key",
        "apiKey",
        "APIKey",
        "wandb_api_key",
        "WANDB_API_KEY",
        "ssh_private_key",
        "gcs_private_key",
        "Authorization",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "secret_key",
        "access_key",
        "account_key",
        "connection_string",
        "X-Api-Key",
        "x-amz-security-token",
        "sig",
        "credentials",
    ],
)
def test_secret_names(name):
    assert masking.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "learning_rate",
        "max_tokens",
        "tokenizer",
        "key",
        "monkey",
        "AWS_ACCESS_KEY_ID",
        "private_key_path",
        "token_file",
        "password_env",
        "passage",
        "bypass",
        "metric",
        "",
    ],
)
def test_names_that_are_not_secrets(name):
    assert not masking.is_secret_name(name)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"postgresql://me:{SECRET}@db:5432/ckpts", "postgresql://me:***@db:5432/ckpts"),
        (
            f"postgresql://me@db/ckpts?sslmode=require&password={SECRET}",
            "postgresql://me@db/ckpts?sslmode=require&password=***",
        ),
        (f"https://acct.blob/c?sv=1&sig={SECRET}&se=2", "https://acct.blob/c?sv=1&sig=***&se=2"),
        (f"AWS_SECRET_ACCESS_KEY={SECRET}", "AWS_SECRET_ACCESS_KEY=***"),
        (f"Authorization: Bearer {SECRET}", "Authorization: ***"),
        (f"{{'api_key': '{SECRET}', 'lr': 0.1}}", "{'api_key': '***', 'lr': 0.1}"),
        (f'{{"token": "{SECRET}"}}', '{"token": "***"}'),
        (f"url=s3://b/p?token={SECRET}", "url=s3://b/p?token=***"),
        (f"Credential=AKIA{SECRET}/2024", "Credential=***"),
        (f"AccountKey={SECRET};EndpointSuffix=x", "AccountKey=***;EndpointSuffix=x"),
        (
            "learning_rate=0.1 steps: 10 http://host:80/x",
            "learning_rate=0.1 steps: 10 http://host:80/x",
        ),
    ],
)
def test_mask_text(text, shown):
    assert masking.mask_text(text) == shown
    assert masking.mask_text(shown) == shown  # idempotent: masking twice changes nothing


def test_mask_value_hides_secret_keys_env_strings_and_urls():
    config = {
        "environment": {
            "environment_variables": [f"AWS_SECRET_ACCESS_KEY={SECRET} with spaces", "SEED=1"]
        },
        "integrations": {"wandb": {"wandb_api_key": SECRET}},
        "headers": {"Authorization": f"Bearer {SECRET}"},
        "hparams": ({"api_key": SECRET, "lr": 0.1},),
        "registry": f"postgresql://u:{SECRET}@h/db",
        "empty_password": "",
        "token_count": 3,
    }
    masked = masking.mask_value(config)
    assert SECRET not in repr(masked)
    # every environment variable's value: a name does not say whether its value is secret
    assert masked["environment"]["environment_variables"] == [
        "AWS_SECRET_ACCESS_KEY=***",
        "SEED=***",
    ]
    assert masked["hparams"] == ({"api_key": "***", "lr": 0.1},)
    assert masked["empty_password"] == "" and masked["token_count"] == 3
    assert SECRET in repr(config)  # the argument is left as it was


def test_errors_never_repeat_a_secret_they_receive():
    exc = errors.InvalidStorageConfig(f"Bad URL s3://k:{SECRET}@b/p?token={SECRET}. Fix it.")
    assert SECRET not in str(exc) and "Fix it." in str(exc)
    assert SECRET not in repr(errors.StorageNotFound(f"password={SECRET}"))


def test_sdk_log_filter_masks_records(caplog):
    from ckptstore.storage_backends import redact

    redact.install()
    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    logging.getLogger("urllib3.connectionpool").debug("GET /c?sig=%s&se=1", SECRET)
    assert SECRET not in caplog.text and "sig=***" in caplog.text


_SAFE_TEXT = st.text(alphabet="abcdefghij0123456789 _-./:", max_size=12)


@given(
    secret=st.text(
        alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789",
        min_size=6,
        max_size=24,
    ),
    prefix=_SAFE_TEXT,
    suffix=st.sampled_from(["", " ", "&x=1", "; y", ", z", "'", '"', "\n"]),
    form=st.sampled_from(
        [
            "password={s}",
            "?token={s}",
            "&api_key={s}",
            "WANDB_API_KEY={s}",
            "postgres://user:{s}@h:1/db",
            "Authorization: Bearer {s}",
            "'client_secret': '{s}'",
            '"ssh_private_key": "{s}"',
        ]
    ),
)
def test_planted_secret_never_survives_in_text(secret, prefix, suffix, form):
    text = f"{prefix} {form.format(s='Zq' + secret)}{suffix}"
    assert "Zq" + secret not in masking.mask_text(text)


def test_cli_log_handlers_mask_every_record(tmp_path):
    """The ``ckptstore`` command puts the filter on its log handlers, so records of any logger
    (not only the SDK ones) are printed masked."""
    import subprocess
    import sys

    code = (
        "import logging, sys\n"
        "from ckptstore.cli.main import cli\n"
        "@cli.command('say')\n"
        "def say():\n"
        f"    logging.getLogger('ckptstore.anything').warning('open postgres://u:{SECRET}@h/db')\n"
        f"sys.argv = ['ckptstore', '--registry', '{tmp_path}/r.db', 'say']\n"
        "cli()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "open postgres://u:***@h/db" in result.stderr and SECRET not in result.stderr


@pytest.mark.parametrize("unit", ["a:", "ab://", "x", "password=", "s3://u:"])
def test_masking_hostile_text_takes_linear_time(unit):
    """256 KiB (four trial log tails) of any shape is masked in about a second: no pattern
    restarts inside a word (a quadratic scan would take minutes here)."""
    import time

    text = unit * (262_144 // len(unit))
    started = time.perf_counter()
    masking.mask_text(text)
    assert time.perf_counter() - started < 20  # ~1 s at load 16 on 2 cores


def test_file_listings_are_file_names_not_secret_names():
    """Issue 39, finding 4: ``model.sig`` is a file (its size stays a number); a secret-named
    setting beside it is still hidden."""
    row = {
        "resources": {"model.sig": 412, "secrets/vocab.txt": 9, "model.keras": 1000},
        "metadata": {"files": {"model.sig": {"size": 412}}, "api_key": "abc"},
        "sig": "deadbeef",
    }
    shown = masking.mask_value(row)
    assert shown["resources"] == row["resources"]
    assert shown["metadata"]["files"] == {"model.sig": {"size": 412}}
    assert shown["metadata"]["api_key"] == masking.MASK and shown["sig"] == masking.MASK
