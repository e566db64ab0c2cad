"""Which registries and storages trials on other hosts can open (ckptstore.experiment.reach);
the Ray engine's refusal on a real cluster is in test_ray_settings.py."""

import pytest

from ckptstore import errors
from ckptstore.experiment.reach import check_reachable, local_only

PG = "postgresql://me:pw-123@db/ckpts"


@pytest.mark.parametrize(
    ("registry", "storage", "local"),
    [
        (PG, "s3://bucket/ckpts", []),
        (PG, {"type": "gcs", "bucket": "b"}, []),
        (PG, {"type": "shared_fs", "host_path": "/mnt/ckpts"}, []),  # declared mounted everywhere
        (PG, {"type": "directory", "container_path": "s3://bucket/x"}, []),
        ("sqlite:////tmp/reg.db", "s3://bucket/ckpts", ["registry"]),
        ("sqlite+pysqlite:///reg.db", "az://c/p", ["registry"]),
        (PG, "/data/ckpts", ["storage"]),
        (PG, "file:///data/ckpts", ["storage"]),
        (PG, "memory://x/y", ["storage"]),
        (PG, {"type": "directory", "container_path": "/data"}, ["storage"]),
        ("sqlite:///reg.db", "ckpts", ["registry", "storage"]),
    ],
)
def test_local_only(registry, storage, local):
    problems = local_only(registry, storage)
    assert ["registry" if p.startswith("the registry") else "storage" for p in problems] == local


def test_refused_only_when_trials_may_run_on_other_hosts():
    check_reachable("sqlite:///reg.db", "/data", other_hosts=set())  # one machine: fine
    check_reachable(PG, {"type": "s3", "bucket": "b"}, other_hosts={"n2"})
    with pytest.raises(errors.UnreachableFromCluster) as info:
        check_reachable(PG, {"type": "directory", "container_path": "/d"}, other_hosts={"n2", "n1"})
    message = str(info.value)
    assert "other hosts (n1, n2)" in message and "folder on this machine" in message
    assert "postgresql://" in message and "shared_fs" in message  # the fix
    assert message.endswith("storage={'type': 'directory', 'container_path': '/d'}.")
    assert "pw-123" not in message and isinstance(info.value, errors.InvalidConfig)  # exit 2
