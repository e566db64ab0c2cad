"""``DistributedContext.from_tf_config()``: ranks and a ``tf.distribute.Strategy`` from TF_CONFIG.

Determined's TensorFlow launcher sets ``TF_CONFIG`` for multi-worker jobs; any launcher that does
the same (or two shells on one machine) works here. The ranks come from TF_CONFIG, and the
cross-worker channel used by ``allgather``/``gather``/``broadcast`` is the TCP star of
:class:`ckptstore.checkpointing.distributed.DistributedContext`, listening on the chief's host.

Channel port: ``CKPTSTORE_DIST_PORT`` when set; otherwise the chief's TF_CONFIG port + 1, moved
further up past any port TF_CONFIG already lists on the chief's host (so two workers on one
machine never collide with TensorFlow's own gRPC ports). Every worker computes the same port
from the same TF_CONFIG.

Example::

    import ckptstore as det

    distributed, strategy = det.core.DistributedContext.from_tf_config()
    with det.core.init(distributed=distributed) as core_context:
        with strategy.scope():
            model = build_model()
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from ckptstore import errors
from ckptstore._not_supported import not_supported
from ckptstore.checkpointing.distributed import ProcessGroup as _BaseDistributedContext
from ckptstore.core._info import DIST_PORT_ENV
from ckptstore.validators import is_int

logger = logging.getLogger(__name__)

TF_CONFIG_ENV = "TF_CONFIG"
#: Task types that train; ``chief`` (if present) is rank 0, then the ``worker`` list.
_TRAINING_TYPES = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class TFClusterLayout:
    """Where this process sits in a TF_CONFIG cluster (pure data, no TensorFlow)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    chief_ip: str
    port: int
    addresses: tuple[str, ...]


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit():
        raise errors.InvalidConfig(
            f"TF_CONFIG addresses must look like host:port. Received: {address!r}."
        )
    return host.strip("[]"), int(port)


def parse_tf_config(
    tf_config: Mapping[str, Any] | str, port: int | None = None
) -> TFClusterLayout | None:
    """Ranks and channel address from a TF_CONFIG dict (or its JSON); None for a single worker.

    Raises :class:`~ckptstore.errors.InvalidConfig` for malformed TF_CONFIG or unsupported task
    types (parameter servers, evaluators).
    """
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as exc:
            raise errors.InvalidConfig(f"TF_CONFIG is not valid JSON ({exc}).") from None
    if not isinstance(tf_config, Mapping):
        raise errors.InvalidConfig("TF_CONFIG must be a JSON object with 'cluster' and 'task'.")
    cluster = tf_config.get("cluster") or {}
    task = tf_config.get("task") or {}
    unsupported = sorted(set(cluster) - set(_TRAINING_TYPES))
    if unsupported:
        raise errors.InvalidConfig(
            f"TF_CONFIG cluster has job(s) {unsupported}; only 'chief' and 'worker' "
            "(MultiWorkerMirroredStrategy) are supported. Remove parameter servers/evaluators."
        )
    addresses: list[str] = []
    for job in _TRAINING_TYPES:
        jobs = cluster.get(job) or []
        if not isinstance(jobs, (list, tuple)):
            raise errors.InvalidConfig(
                f"TF_CONFIG cluster.{job} must be a list of host:port. Received: {jobs!r}."
            )
        addresses.extend(str(a) for a in jobs)
    if len(addresses) <= 1:
        return None
    task_type, task_index = task.get("type"), task.get("index", 0)
    if task_type not in _TRAINING_TYPES:
        raise errors.InvalidConfig(
            f"TF_CONFIG task.type must be 'chief' or 'worker'. Received: task.type={task_type!r}."
        )
    offset = len(cluster.get("chief") or []) if task_type == "worker" else 0
    rank = offset + int(task_index)
    if not 0 <= rank < len(addresses):
        raise errors.InvalidConfig(
            f"TF_CONFIG task.index={task_index} is outside the {task_type} list "
            f"({len(cluster.get(task_type) or [])} entries)."
        )
    hosts = [_split_address(a)[0] for a in addresses]
    distinct_hosts = list(dict.fromkeys(hosts))
    my_host = hosts[rank]
    chief_host, chief_port = _split_address(addresses[0])
    if port is None:
        taken = {p for h, p in map(_split_address, addresses) if h == chief_host}
        port = chief_port + 1
        while port in taken:
            port += 1
    return TFClusterLayout(
        rank=rank,
        size=len(addresses),
        local_rank=hosts[:rank].count(my_host),
        local_size=hosts.count(my_host),
        cross_rank=distinct_hosts.index(my_host),
        cross_size=len(distinct_hosts),
        chief_ip=chief_host,
        port=port,
        addresses=tuple(addresses),
    )


def _port_from_env() -> int | None:
    raw = os.environ.get(DIST_PORT_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise errors.InvalidConfig(
            f"{DIST_PORT_ENV} must be a TCP port number. Received: {DIST_PORT_ENV}={raw!r}."
        )
    return int(raw)


def shard_batch_size(global_batch_size: int, size: int) -> int:
    """``global_batch_size // size``; InvalidConfig when it is not a positive multiple of ``size``."""
    if not is_int(global_batch_size):
        raise errors.InvalidConfig(
            f"global_batch_size must be an int. Received: global_batch_size={global_batch_size!r}."
        )
    if global_batch_size < size or global_batch_size % size:
        raise errors.InvalidConfig(
            f"global_batch_size must be a positive multiple of the number of workers ({size}) so "
            f"every worker gets the same batch size. Received: global_batch_size={global_batch_size}."
        )
    return global_batch_size // size


class DistributedContext(_BaseDistributedContext):
    """Determined's ``core.DistributedContext`` with :meth:`from_tf_config`.

    Everything else (``rank``, ``size``, ``allgather``, ``broadcast``, ...) comes from
    :class:`ckptstore.checkpointing.distributed.DistributedContext`.

    Example::

        distributed, strategy = DistributedContext.from_tf_config()
        print(distributed.rank, distributed.size, strategy.num_replicas_in_sync)
    """

    def __init__(
        self,
        rank: int,
        size: int,
        local_rank: int | None = None,
        local_size: int | None = None,
        cross_rank: int | None = None,
        cross_size: int | None = None,
        chief_ip: str | None = None,
        port: int | None = None,
        timeout: float = 300.0,
        *,
        pub_port: int | None = None,
        pull_port: int | None = None,
        port_offset: int = 0,
        force_tcp: bool = False,
    ) -> None:
        # Determined's ZMQ pair (pub_port, pull_port) is one TCP channel here: pub_port (+
        # port_offset) is its port; pull_port and force_tcp have nothing left to choose.
        if port is None and pub_port is not None:
            port = pub_port + port_offset
        super().__init__(
            rank,
            size,
            local_rank,
            local_size,
            cross_rank,
            cross_size,
            chief_ip or "127.0.0.1",
            port,
            timeout,
        )

    def get_num_agents(self) -> int:
        """The number of machines (Determined's agents) in the job: ``cross_size``."""
        return self.cross_size

    from_horovod = staticmethod(
        not_supported(
            "DistributedContext.from_horovod",
            "DistributedContext.from_tf_config() with MultiWorkerMirroredStrategy",
        )
    )
    from_deepspeed = staticmethod(
        not_supported("DistributedContext.from_deepspeed", "DistributedContext.from_tf_config()")
    )
    from_torch_distributed = staticmethod(
        not_supported(
            "DistributedContext.from_torch_distributed", "DistributedContext.from_tf_config()"
        )
    )

    def shard_batch_size(self, global_batch_size: int) -> int:
        """This worker's batch size, so that all workers together use ``global_batch_size``."""
        return shard_batch_size(global_batch_size, self.size)

    @classmethod
    def from_tf_config(
        cls, tf_config: Mapping[str, Any] | str | None = None, *, port: int | None = None
    ) -> tuple[DistributedContext, Any]:
        """``(distributed, strategy)`` for this process.

        - TF_CONFIG naming several chief/worker tasks: ``MultiWorkerMirroredStrategy``, rank =
          position in the chief+worker list, chief = rank 0. Blocks until all workers started.
        - otherwise, several local GPUs: ``MirroredStrategy`` in one process (size 1).
        - otherwise: the default strategy (size 1).

        Args:
            tf_config: TF_CONFIG as a dict or JSON; default: the ``TF_CONFIG`` env var.
            port: channel port; default ``CKPTSTORE_DIST_PORT`` or chief port + 1 (see module).
        """
        import tensorflow as tf

        if tf_config is None:
            tf_config = os.environ.get(TF_CONFIG_ENV) or "{}"
        layout = parse_tf_config(tf_config, port if port is not None else _port_from_env())
        if layout is not None:
            if isinstance(tf_config, Mapping):
                os.environ[TF_CONFIG_ENV] = json.dumps(dict(tf_config))
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            logger.info(
                "MultiWorkerMirroredStrategy: rank %d of %d; channel on %s:%d",
                layout.rank,
                layout.size,
                layout.chief_ip,
                layout.port,
            )
            distributed = cls(
                rank=layout.rank,
                size=layout.size,
                local_rank=layout.local_rank,
                local_size=layout.local_size,
                cross_rank=layout.cross_rank,
                cross_size=layout.cross_size,
                chief_ip=layout.chief_ip,
                port=layout.port,
            )
            return distributed, strategy
        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) > 1:
            strategy = tf.distribute.MirroredStrategy()
            logger.info("MirroredStrategy over %d local GPUs", len(gpus))
        else:
            strategy = tf.distribute.get_strategy()
        return cls(rank=0, size=1), strategy


class DummyDistributedContext(DistributedContext):
    """Determined's ``core.DummyDistributedContext``: one process, rank 0 of 1, collectives
    return at once.

    Example::

        with det.core.init(distributed=det.core.DummyDistributedContext()) as core_context:
            assert core_context.distributed.get_size() == 1
    """

    def __init__(self) -> None:
        super().__init__(rank=0, size=1)


__all__ = [
    "DistributedContext",
    "DummyDistributedContext",
    "TFClusterLayout",
    "parse_tf_config",
    "shard_batch_size",
]
