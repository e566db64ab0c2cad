"""Registry URLs, SQLite settings, default location, schema migrations and password hygiene."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from ckptstore import errors
from ckptstore.registry import Registry, migrations, open_registry, schema
from ckptstore.registry.engine import normalize_url, safe_url
from tests._helpers.ports import free_port

SECRET = "s3cr3t-Pa55word"


def test_normalize_url_forms(tmp_path):
    plain = normalize_url(str(tmp_path / "reg.db"))
    assert plain.get_backend_name() == "sqlite" and plain.database == str(tmp_path / "reg.db")
    rel = normalize_url("sqlite:///relative/reg.db")
    assert rel.database == os.path.abspath("relative/reg.db")
    assert normalize_url("postgres://u:p@h:5/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgresql+psycopg2://u@h/db").drivername == "postgresql+psycopg2"
    assert normalize_url("sqlite://").database in (None, "")


@pytest.mark.parametrize("bad", ["", "   ", "mysql://u:pw@h/db", None])
def test_bad_urls_raise_registry_error(bad):
    with pytest.raises(errors.RegistryError) as info:
        normalize_url(bad)  # type: ignore[arg-type]
    assert "sqlite:///" in str(info.value)  # the message says what to use
    assert "pw@" not in str(info.value)


def test_default_location_from_env_and_home(tmp_path, monkeypatch):
    monkeypatch.delenv("CKPTSTORE_REGISTRY", raising=False)
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path / "home" / "deep"))
    with Registry() as reg:
        assert reg.url.endswith("home/deep/registry.db")
        reg.create_trial()
    assert (tmp_path / "home" / "deep" / "registry.db").exists()

    monkeypatch.setenv("CKPTSTORE_REGISTRY", f"sqlite:///{tmp_path / 'env' / 'r.db'}")
    with open_registry(None) as reg:
        assert reg.url.endswith("env/r.db")
    assert (tmp_path / "env" / "r.db").exists()


def test_open_registry_accepts_url_path_and_instance(tmp_path):
    with open_registry(str(tmp_path / "a.db")) as reg:
        assert open_registry(reg) is reg
    with open_registry(tmp_path / "b.db") as reg:  # os.PathLike
        assert reg.dialect == "sqlite"
    with pytest.raises(errors.InvalidConfig, match="int"):
        open_registry(42)  # type: ignore[arg-type]


def test_in_memory_sqlite_works():
    with Registry("sqlite://") as reg:
        trial = reg.create_trial()
        assert reg.get_trial(trial).id == trial


def test_sqlite_pragmas(tmp_path):
    with Registry(str(tmp_path / "r.db")) as reg:
        with reg._db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def _applied(reg: Registry) -> list[tuple]:
    with reg._db.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.select(
                    schema.schema_version.c.version, schema.schema_version.c.applied_at
                ).order_by(schema.schema_version.c.version)
            )
        ]


def test_migrations_apply_once_and_are_idempotent(registry_url):
    with Registry(registry_url) as reg:
        first = _applied(reg)
        assert [v for v, _ in first] == [m.version for m in migrations.MIGRATIONS]
        assert reg._db.version == migrations.LATEST_VERSION
        reg.create_trial(trial_id=5)
    with Registry(registry_url) as reg:
        assert _applied(reg) == first  # nothing re-applied
        assert reg.get_trial(5).id == 5  # data kept
        # applying directly again is a no-op too
        assert migrations.migrate(reg._db.engine) == migrations.LATEST_VERSION
        assert _applied(reg) == first


def test_missing_migrations_are_applied_on_open(registry_url):
    with Registry(registry_url) as reg:
        with reg._db.engine.begin() as conn:
            conn.exec_driver_sql("DROP INDEX ix_checkpoints_trial_steps_created")
            conn.execute(schema.schema_version.delete().where(schema.schema_version.c.version >= 2))
    with Registry(registry_url) as reg:
        assert [v for v, _ in _applied(reg)] == [m.version for m in migrations.MIGRATIONS]
        names = {ix["name"] for ix in sa.inspect(reg._db.engine).get_indexes("checkpoints")}
        assert "ix_checkpoints_trial_steps_created" in names


def test_newer_schema_is_refused(registry_url):
    with Registry(registry_url) as reg:
        with reg._db.engine.begin() as conn:
            conn.execute(
                schema.schema_version.insert().values(
                    version=migrations.LATEST_VERSION + 1,
                    description="future",
                    applied_at=schema.utcnow(),
                )
            )
    with pytest.raises(errors.RegistryError, match="Upgrade ckptstore"):
        Registry(registry_url)


@pytest.mark.parametrize("form", ["user-info", "query"])
def test_postgres_password_never_shown(postgres_server, form, caplog):
    """In ``postgres:PASSWORD@`` and, issue 27 finding 5, libpq's query form ``?password=``."""
    caplog.set_level("DEBUG")
    url = postgres_server.create_database()
    if form == "user-info":
        url = url.replace("postgres@", f"postgres:{SECRET}@")
    else:
        url += f"?password={SECRET}&application_name=t"
    with Registry(url) as reg:  # trust auth ignores the password, so this connects
        assert SECRET not in repr(reg) and SECRET not in reg.url
        assert "***" in repr(reg) and reg.dialect == "postgresql"
        with pytest.raises(errors.TrialNotFound) as info:
            reg.get_trial(1)
        assert SECRET not in str(info.value)
    with pytest.raises(errors.RegistryError, match="closed") as info:
        reg.list_trials()
    assert SECRET not in str(info.value)
    assert SECRET not in safe_url(url) and SECRET not in caplog.text


def test_postgres_server_error_hides_a_query_password(postgres_server):
    missing = postgres_server.url("no_such_database") + f"?password={SECRET}"
    with pytest.raises(errors.RegistryError, match="failed to open") as info:
        Registry(missing)  # a real server error, raised through Database._error
    assert SECRET not in str(info.value) and "password=***" in str(info.value)


def test_unreachable_postgres_error_is_clear_and_password_free(caplog):
    url = f"postgres://me:{SECRET}@127.0.0.1:{free_port()}/ckpts"  # nothing listens there
    caplog.set_level("DEBUG")
    with pytest.raises(errors.RegistryError) as info:
        Registry(url)
    message = str(info.value)
    assert SECRET not in message and "me:***@127.0.0.1" in message
    assert "server is running" in message
    assert SECRET not in caplog.text
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_v4_registry_with_trial_leases_upgrades_in_place(registry_url):
    """A registry from before the Optuna queue (schema 4: a trial_leases table, no
    trials.search_slot) is migrated on open, keeping its trials; slots then work."""
    with Registry(registry_url) as reg:
        exp = reg.create_experiment("old", config={})
        old_trial = reg.create_trial(experiment_id=exp, hparams={"lr": 0.1})
        with reg._db.engine.begin() as conn:  # back to what a version-4 registry looks like
            conn.exec_driver_sql("DROP INDEX ux_trials_experiment_search_slot")
            conn.exec_driver_sql("ALTER TABLE trials DROP COLUMN search_slot")
            migrations._V4_TRIAL_LEASES.create(conn)
            conn.exec_driver_sql(
                "INSERT INTO trial_leases VALUES "
                f"({old_trial}, 'host:1', '2026-01-01', '2026-01-01', '2026-01-01', NULL, 1)"
            )
            # (and without the later migrations' tables: the jobs table came with version 6)
            conn.exec_driver_sql("DROP TABLE jobs")
            conn.execute(schema.schema_version.delete().where(schema.schema_version.c.version >= 5))
    with Registry(registry_url) as reg:
        assert [v for v, _ in _applied(reg)] == [m.version for m in migrations.MIGRATIONS]
        inspector = sa.inspect(reg._db.engine)
        assert not inspector.has_table("trial_leases")
        assert "search_slot" in {c["name"] for c in inspector.get_columns("trials")}
        assert reg.get_trial(old_trial).hparams == {"lr": 0.1}
        first = reg.ensure_slot_trial(exp, 0, lambda: {"lr": 0.2})
        # the same slot gives the same trial; hparams are not asked for again
        assert reg.ensure_slot_trial(exp, 0, lambda: pytest.fail("asked twice")) == first
        assert reg.ensure_slot_trial(exp, 1, {"lr": 0.3}) not in (first, old_trial)
        assert [t.id for t in reg.list_trials(exp)] == sorted([old_trial, first, first + 1])


def test_slot_trial_rejects_bad_input(registry_url):
    with Registry(registry_url) as reg:
        exp = reg.create_experiment("e", config={})
        with pytest.raises(errors.InvalidConfig, match="slot=-1"):
            reg.ensure_slot_trial(exp, -1, {})
        with pytest.raises(errors.InvalidConfig, match="Received: list"):
            reg.ensure_slot_trial(exp, 0, lambda: [1])  # type: ignore[arg-type,return-value]
        with pytest.raises(errors.ExperimentNotFound):
            reg.ensure_slot_trial(exp + 100, 0, {})
        assert reg.list_trials(exp) == []
