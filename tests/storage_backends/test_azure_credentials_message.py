"""Issue 39, finding 6: with no Azure credentials the error called the connection string
"malformed"; it now names every setting looked for."""

from __future__ import annotations

import pytest

from ckptstore import errors
from ckptstore.storage_backends import open_storage


def test_no_azure_credentials_names_the_settings_looked_for(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(errors.InvalidStorageConfig) as info:
        open_storage("az://ckpts/exp")
    text = str(info.value)
    assert "malformed" not in text
    for setting in ("AZURE_STORAGE_CONNECTION_STRING", "connection_string=", "account_url="):
        assert setting in text


def test_a_malformed_connection_string_is_still_called_so():
    with pytest.raises(errors.InvalidStorageConfig, match="malformed"):
        open_storage("az://ckpts/exp", connection_string="not a connection string")
