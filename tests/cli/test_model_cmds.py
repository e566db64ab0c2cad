"""`ckptstore model ...`: create, list, describe, versions, aliases, download."""

from __future__ import annotations

import getpass

import pytest

from ckptstore import errors
from ckptstore.checkpointing import signing
from ckptstore.cli.errors import EXIT_BAD_INPUT, EXIT_NOT_FOUND
from ckptstore.cli.model_cmds import parse_model_ref
from tests.checkpointing._helpers import ec_key_pair


def test_model_lifecycle(env, tmp_path, monkeypatch):
    first = env.save(1, 10, files={"model.keras": b"one"})
    second = env.save(1, 20, files={"model.keras": b"two"})
    created = env.json("model", "create", "mnist", "--description", "digits", "--label", "vision")
    assert created["name"] == "mnist" and created["labels"] == ["vision"]
    assert env.run("model", "create", "mnist").exit_code == EXIT_BAD_INPUT  # name taken

    assert env.json("model", "register-version", "mnist", first)["version"] == 1
    assert env.json("model", "register-version", "mnist", second)["version"] == 2
    assert env.run("model", "set-alias", "mnist", "1", "production").exit_code == 0

    listed = env.json("model", "list")
    assert [(m["name"], m["versions"]) for m in listed] == [("mnist", 2)]
    described = env.json("model", "describe", "mnist")
    versions = {v["version"]: v for v in described["versions"]}
    assert versions[1]["checkpoint_uuid"] == first and versions[1]["aliases"] == ["production"]
    assert versions[2]["checkpoint_uuid"] == second
    assert "production" in env.run("model", "describe", "mnist").stdout

    for ref, expected in (("mnist@production", b"one"), ("mnist:2", b"two"), ("mnist", b"two")):
        out = tmp_path / ref.replace("@", "_").replace(":", "_")
        result = env.run("model", "download", ref, "-o", str(out))
        assert result.exit_code == 0, result.output
        assert (out / "model.keras").read_bytes() == expected
    # a verify key in the environment holds for `model download` too: these are unsigned
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, ec_key_pair(tmp_path)[1])
    refused = env.run("model", "download", "mnist:2", "-o", str(tmp_path / "unsigned"))
    assert refused.exit_code == 5 and "not signed" in refused.output, refused.output
    monkeypatch.delenv(signing.VERIFY_KEY_ENV)

    # moving the alias takes it from version 1
    assert env.run("model", "set-alias", "mnist", "2", "production").exit_code == 0
    described = env.json("model", "describe", "mnist")
    assert [v["aliases"] for v in described["versions"]] == [[], ["production"]]
    moves = [(m["alias"], m["version"], m["previous"]) for m in described["alias_history"]]
    assert moves == [("production", 2, 1), ("production", 1, None)]
    assert {m["moved_by"] for m in described["alias_history"]} == {getpass.getuser()}
    assert "alias moves" in env.run("model", "describe", "mnist").stdout


def test_model_errors(env):
    uuid = env.save(1, 10)
    assert env.run("model", "describe", "nope").exit_code == EXIT_NOT_FOUND
    assert env.run("model", "register-version", "nope", uuid).exit_code == EXIT_NOT_FOUND
    env.run("model", "create", "m")
    assert env.run("model", "register-version", "m", "no-such-uuid").exit_code == EXIT_NOT_FOUND
    assert env.run("model", "download", "m@missing", "-o", "x").exit_code == EXIT_NOT_FOUND
    assert env.run("model", "download", "m@a@b").exit_code == EXIT_BAD_INPUT
    assert env.run("model", "set-alias", "m", "1", "7").exit_code in (
        EXIT_BAD_INPUT,
        EXIT_NOT_FOUND,
    )


@pytest.mark.parametrize(
    "ref, expected",
    [("m", ("m", -1)), ("m:3", ("m", 3)), ("m@prod", ("m", "prod")), ("a-b_c:12", ("a-b_c", 12))],
)
def test_parse_model_ref(ref, expected):
    assert parse_model_ref(ref) == expected


@pytest.mark.parametrize("ref", ["", "m@", "m:x", "m@a:1", "@a"])
def test_parse_model_ref_rejects(ref):
    with pytest.raises(errors.InvalidConfig, match="NAME@ALIAS"):
        parse_model_ref(ref)
