"""Whether trials on other machines can reach an experiment's registry and checkpoint storage.

A trial placed on another host opens the registry and the storage itself, with the URLs the
driver sends it. A SQLite file or a local folder named by the driver is a *different* (empty)
file or folder there, so such trials would fail (``ExperimentNotFound``) or, worse, write
checkpoints nobody finds. :func:`check_reachable` refuses that combination before any trial
starts; one machine (a local Ray, or every node on this host) keeps working with SQLite.

What counts as "another host": a Ray node whose hostname (``NodeManagerHostname`` in
``ray.nodes()``, the node's ``socket.gethostname()``) differs from the driver's. Node IPs are
not used: on one machine nodes may listen on several addresses (127.0.0.2, 127.0.0.3, the
interface address), while two containers (or two machines) have different hostnames and do
not share files unless they mount them. A folder mounted at the same path on every node is
declared with Determined's ``checkpoint_storage: {type: shared_fs, host_path: ...}``.

Example::

    from ckptstore.experiment.reach import check_reachable

    check_reachable("sqlite:///reg.db", "/data/ckpts", other_hosts={"gpu-2"})  # raises
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ckptstore import errors
from ckptstore.masking import mask_text, mask_value

#: Storage schemes that name something only this machine (or this process) holds.
LOCAL_SCHEMES = frozenset({"file", "local", "memory"})


def _storage_scheme(storage: str | Mapping[str, Any]) -> str | None:
    """The scheme a storage spec opens, or None for a folder declared shared (``shared_fs``)."""
    from ckptstore.storage_backends import url_scheme
    from ckptstore.storage_backends.config import parse_storage_config

    if isinstance(storage, Mapping):
        if storage.get("type") == "shared_fs":
            return None
        url, _ = parse_storage_config(storage)
        return url_scheme(url)
    return url_scheme(storage)


def local_only(registry_url: str, storage: str | Mapping[str, Any]) -> list[str]:
    """What of the registry and storage only this machine can open (empty: all reachable)."""
    problems = []
    if registry_url.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite":
        problems.append(
            f"the registry is a SQLite file on this machine ({mask_text(registry_url)})"
        )
    scheme = _storage_scheme(storage)
    if scheme in LOCAL_SCHEMES:
        shown = mask_value(dict(storage)) if isinstance(storage, Mapping) else storage
        problems.append(f"the checkpoint storage is a folder on this machine ({shown})")
    return problems


def check_reachable(
    registry_url: str, storage: str | Mapping[str, Any], *, other_hosts: Collection[str]
) -> None:
    """Raise :class:`~ckptstore.errors.UnreachableFromCluster` when trials may run on
    ``other_hosts`` but the registry or storage lives on this machine."""
    if not other_hosts:
        return
    problems = local_only(registry_url, storage)
    if problems:
        raise errors.UnreachableFromCluster(
            f"Trials would run on other hosts ({', '.join(sorted(other_hosts))}), which cannot "
            f"open {' or '.join(problems)}. Give every node the same registry and storage: a "
            "PostgreSQL registry (`--registry postgresql://user@db-host/ckpts`) and object "
            "storage (`--storage s3://bucket/prefix`, gs://, az://), or a folder mounted at the "
            "same path on every node declared as `checkpoint_storage: {type: shared_fs, "
            "host_path: /mnt/ckpts}`. Received: "
            f"registry={mask_text(registry_url)!r}, storage={mask_value(storage)!r}."
        )


__all__ = ["LOCAL_SCHEMES", "check_reachable", "local_only"]
