"""`ckptstore checkpoint ...` against real local storage and a SQLite registry."""

from __future__ import annotations

import os

from ckptstore.cli.errors import EXIT_BAD_INPUT, EXIT_CORRUPT, EXIT_NOT_FOUND


def test_list_and_describe(env):
    a = env.save(1, 10, experiment_id=1, metrics={"val_loss": 0.5})
    b = env.save(1, 20, experiment_id=1, metrics={"val_loss": 0.3})
    c = env.save(2, 5)
    rows = env.json("checkpoint", "list")
    # trial by trial, then by steps: trial 2's 5 steps after trial 1's 10 and 20, not between
    assert [r["uuid"] for r in rows] == [a, b, c]
    assert {r["uuid"]: r["steps_completed"] for r in rows} == {a: 10, b: 20, c: 5}
    assert [r["uuid"] for r in env.json("checkpoint", "list", "--trial", "1")] == [a, b]
    assert [r["uuid"] for r in env.json("checkpoint", "list", "--experiment", "1")] == [a, b]

    table = env.run("checkpoint", "list", "--trial", "1")
    assert table.exit_code == 0
    assert a in table.stdout and b in table.stdout and c not in table.stdout
    assert "UUID" in table.stdout.splitlines()[0]

    detail = env.json("checkpoint", "describe", b)
    assert detail["steps_completed"] == 20 and detail["state"] == "COMMITTED"
    assert detail["metrics"]["val_loss"] == 0.3
    assert "model.keras" in detail["resources"]
    text = env.run("checkpoint", "describe", b)
    assert "model.keras" in text.stdout and "COMMITTED" in text.stdout


def test_not_found_exit_codes(env):
    env.save(1, 10)
    missing = env.run("checkpoint", "describe", "no-such-uuid")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert "no-such-uuid" in missing.output and "checkpoint list" in missing.output
    assert env.run("checkpoint", "list", "--trial", "99").exit_code == EXIT_NOT_FOUND
    assert env.run("checkpoint", "download", "no-such-uuid", "-o", "x").exit_code == EXIT_NOT_FOUND


def test_bad_input_exit_code(env):
    result = env.run("--storage", "nosuchscheme://bucket/x", "storage", "validate")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert env.run("checkpoint", "list", "--trial", "abc").exit_code == EXIT_BAD_INPUT


def test_download_with_selector_and_verify(env, tmp_path):
    uuid = env.save(
        1, 10, files={"model.keras": b"k" * 5000, "saved_model/a.pb": b"pb", "x.txt": b"x"}
    )
    out = tmp_path / "out"
    result = env.run("checkpoint", "download", uuid, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "model.keras").read_bytes() == b"k" * 5000
    assert (out / "saved_model" / "a.pb").read_bytes() == b"pb"
    assert (out / "MANIFEST.json").exists() and (out / "metadata.json").exists()

    only = tmp_path / "only"
    result = env.run("checkpoint", "download", uuid, "-o", str(only), "--selector", "*.keras")
    assert result.exit_code == 0, result.output
    assert (only / "model.keras").exists() and not (only / "saved_model").exists()

    verified = env.json("checkpoint", "verify", uuid)
    assert verified == {"uuid": uuid, "ok": True, "files": 4, "bytes": verified["bytes"]}

    # damage the stored copy: verify must say which file, with the corrupt-checkpoint code
    env.corrupt(uuid, "model.keras")
    bad = env.run("checkpoint", "verify", uuid)
    assert bad.exit_code == EXIT_CORRUPT
    assert "model.keras" in bad.output and "ChecksumMismatch" in bad.output


def test_delete_by_glob_then_whole(env):
    uuid = env.save(1, 10, files={"model.keras": b"k", "saved_model/a.pb": b"pb"})
    result = env.run("checkpoint", "delete", uuid, "--glob", "saved_model/*", "-y")
    assert result.exit_code == 0, result.output
    detail = env.json("checkpoint", "describe", uuid)
    assert detail["state"] == "PARTIALLY_DELETED"
    assert "saved_model/a.pb" not in detail["resources"] and "model.keras" in detail["resources"]
    assert not os.path.exists(os.path.join(env.storage_url, uuid, "saved_model", "a.pb"))

    declined = env.run("checkpoint", "delete", uuid, input="n\n")
    assert declined.exit_code == 1 and os.path.exists(os.path.join(env.storage_url, uuid))
    assert env.run("checkpoint", "delete", uuid, "-y").exit_code == 0
    assert env.json("checkpoint", "list") == []
    assert [r["state"] for r in env.json("checkpoint", "list", "--all")] == ["DELETED"]
    assert not os.path.exists(os.path.join(env.storage_url, uuid, "model.keras"))


def test_delete_refuses_model_version(env):
    uuid = env.save(1, 10)
    assert env.run("model", "create", "m").exit_code == 0
    assert env.run("model", "register-version", "m", uuid).exit_code == 0
    refused = env.run("checkpoint", "delete", uuid, "-y")
    assert refused.exit_code == 2 and "model version" in refused.output
    assert env.json("checkpoint", "describe", uuid)["model_versions"] == ["m:1"]


def test_delete_refuses_checkpoint_pinned_by_a_running_process(env):
    uuid = env.save(1, 10)
    with env.registry() as registry:
        registry.pin_checkpoint(uuid, "otherhost:4242:abc")
    refused = env.run("checkpoint", "delete", uuid, "-y")
    assert refused.exit_code == 2 and "pinned by a running process" in refused.output
    assert env.json("checkpoint", "describe", uuid)["state"] == "COMMITTED"
    with env.registry() as registry:
        registry.unpin_checkpoint(uuid, "otherhost:4242:abc")
    assert env.run("checkpoint", "delete", uuid, "-y").exit_code == 0
