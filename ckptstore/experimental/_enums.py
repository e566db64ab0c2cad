"""Determined's SDK enums (names and values as in ``determined.experimental.client``) and the
one sort rule of the SDK's list calls (:func:`sort_rows`).

Example::

    from ckptstore.experimental._enums import CheckpointSortBy, OrderBy, sort_rows

    rows = sort_rows(rows, CheckpointSortBy.UUID, OrderBy.DESCENDING, {CheckpointSortBy.UUID: key})
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from ckptstore import errors


# ---- enums (Determined's names and values) -------------------------------------------------------
class DownloadMode(enum.Enum):
    """How ``Checkpoint.download`` reaches storage. ``DIRECT`` and ``AUTO`` read the storage
    directly (there is no master to proxy through); ``MASTER`` raises NotSupported."""

    DIRECT = "direct"
    MASTER = "master"
    AUTO = "auto"


class CheckpointState(enum.Enum):
    ACTIVE = "STATE_ACTIVE"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"


class OrderBy(enum.Enum):
    ASCENDING = "ORDER_BY_ASC"
    DESCENDING = "ORDER_BY_DESC"


class CheckpointOrderBy(enum.Enum):
    """Determined's deprecated checkpoint ordering (same values as :class:`OrderBy`)."""

    ASC = "ORDER_BY_ASC"
    DESC = "ORDER_BY_DESC"


class ExperimentSortBy(enum.Enum):
    ID = "SORT_BY_ID"
    DESCRIPTION = "SORT_BY_DESCRIPTION"
    START_TIME = "SORT_BY_START_TIME"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    NUM_TRIALS = "SORT_BY_NUM_TRIALS"
    PROGRESS = "SORT_BY_PROGRESS"
    USER = "SORT_BY_USER"
    NAME = "SORT_BY_NAME"
    FORKED_FROM = "SORT_BY_FORKED_FROM"
    RESOURCE_POOL = "SORT_BY_RESOURCE_POOL"
    PROJECT_ID = "SORT_BY_PROJECT_ID"
    CHECKPOINT_SIZE = "SORT_BY_CHECKPOINT_SIZE"
    CHECKPOINT_COUNT = "SORT_BY_CHECKPOINT_COUNT"
    SEARCHER_METRIC_VAL = "SORT_BY_SEARCHER_METRIC_VAL"


class CheckpointSortBy(enum.Enum):
    UUID = "SORT_BY_UUID"
    TRIAL_ID = "SORT_BY_TRIAL_ID"
    BATCH_NUMBER = "SORT_BY_BATCH_NUMBER"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    SEARCHER_METRIC = "SORT_BY_SEARCHER_METRIC"


class TrialSortBy(enum.Enum):
    ID = "SORT_BY_ID"
    START_TIME = "SORT_BY_START_TIME"
    END_TIME = "SORT_BY_END_TIME"
    STATE = "SORT_BY_STATE"
    BEST_VALIDATION_METRIC = "SORT_BY_BEST_VALIDATION_METRIC"
    LATEST_VALIDATION_METRIC = "SORT_BY_LATEST_VALIDATION_METRIC"
    BATCHES_PROCESSED = "SORT_BY_BATCHES_PROCESSED"
    DURATION = "SORT_BY_DURATION"
    RESTARTS = "SORT_BY_RESTARTS"
    CHECKPOINT_SIZE = "SORT_BY_CHECKPOINT_SIZE"
    LOG_RETENTION_DAYS = "SORT_BY_LOG_RETENTION_DAYS"


class ModelSortBy(enum.Enum):
    NAME = "SORT_BY_NAME"
    DESCRIPTION = "SORT_BY_DESCRIPTION"
    CREATION_TIME = "SORT_BY_CREATION_TIME"
    LAST_UPDATED_TIME = "SORT_BY_LAST_UPDATED_TIME"
    NUM_VERSIONS = "SORT_BY_NUM_VERSIONS"
    WORKSPACE = "SORT_BY_WORKSPACE"


class TrialState(enum.Enum):
    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    CANCELED = "STATE_CANCELED"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


class ExperimentState(enum.Enum):
    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"
    DELETED = "STATE_DELETED"
    DELETING = "STATE_DELETING"
    DELETE_FAILED = "STATE_DELETE_FAILED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"


#: ckptstore checkpoint state -> Determined's.
_CHECKPOINT_STATES = {
    "PENDING": CheckpointState.ACTIVE,
    "COMMITTED": CheckpointState.COMPLETED,
    "PARTIALLY_DELETED": CheckpointState.PARTIALLY_DELETED,
    "DELETED": CheckpointState.DELETED,
}
_TERMINAL = ("COMPLETED", "CANCELED", "ERROR")
_LIVE = ("COMMITTED", "PARTIALLY_DELETED")


def _checked_enum(enum_cls: type[enum.Enum], value: Any, argument: str) -> Any:
    if value is None or isinstance(value, enum_cls):
        return value
    if enum_cls is OrderBy and isinstance(value, CheckpointOrderBy):
        return OrderBy(value.value)
    raise errors.InvalidConfig(
        f"{argument} must be a client.{enum_cls.__name__} "
        f"({', '.join(m.name for m in enum_cls)}). Received: {argument}={value!r}."
    )


def _descending(order_by: OrderBy | None, default: OrderBy) -> bool:
    order_by = _checked_enum(OrderBy, order_by, "order_by") or default
    return order_by.value == OrderBy.DESCENDING.value


def sort_rows(
    rows: Iterable[Any],
    sort_by: enum.Enum,
    order_by: OrderBy | None,
    keys: Mapping[enum.Enum, Any],
    default_order: OrderBy = OrderBy.ASCENDING,
) -> list[Any]:
    """``rows`` sorted by the key function ``keys[sort_by]``; InvalidConfig naming the keys
    ckptstore can sort by when ``sort_by`` needs data it does not record."""
    if sort_by not in keys:
        raise errors.InvalidConfig(
            f"sort_by={sort_by!r} needs data ckptstore does not record; use one of "
            f"{[k.name for k in keys]}."
        )
    return sorted(rows, key=keys[sort_by], reverse=_descending(order_by, default_order))
