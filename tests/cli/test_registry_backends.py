"""The verbs against both registry databases (SQLite file and a real PostgreSQL server)."""

from __future__ import annotations

from tests.cli.helpers import Env


def test_verbs_on_sqlite_and_postgresql(registry_url, tmp_path):
    env = Env(str(tmp_path / "store"), registry_url, str(tmp_path))
    uuid = env.save(3, 30, experiment_id=2, metrics={"val_loss": 0.25})
    with env.registry() as registry:
        registry.report_metrics(3, "validation", 30, {"val_loss": 0.25})
    assert [r["uuid"] for r in env.json("checkpoint", "list", "--experiment", "2")] == [uuid]
    trial = env.json("trial", "describe", "3")
    assert trial["latest_metrics"]["validation"]["val_loss"] == 0.25
    assert [c["uuid"] for c in trial["checkpoints"]] == [uuid]
    env.run("model", "create", "m")
    assert env.json("model", "register-version", "m", uuid)["version"] == 1
    assert env.run("trial", "report", "3", "-o", str(tmp_path / "r.html")).exit_code == 0
    assert uuid in (tmp_path / "r.html").read_text()
    assert env.run("trial", "describe", "4").exit_code == 3
