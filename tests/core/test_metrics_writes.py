"""Training metrics are written to the registry in the background, in the order reported
(issue 42): the calls return at once, and what the registry holds, and in which order, is as if
each had been written at its call; a write that fails raises its own error type to the script.

The slow writer is real: another connection holds the registry's write lock (a second process
writing the same SQLite file, an open PostgreSQL transaction locking the metrics table).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.core import init
from ckptstore.registry import Registry, schema
from ckptstore.registry.engine import WRITE_OPTION, make_engine


@contextlib.contextmanager
def _metrics_locked(engine: sa.Engine) -> Iterator[None]:
    """Another writer holds the lock every metrics insert needs until the block ends."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{WRITE_OPTION: True})  # SQLite: BEGIN IMMEDIATE
        with conn.begin() as tx:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("LOCK TABLE metrics IN EXCLUSIVE MODE")  # reads still run
            yield
            tx.rollback()


def _rows(engine: sa.Engine, trial_id: int) -> list[tuple[str, int, dict]]:
    """The trial's metric rows in the order they were inserted, read from outside ckptstore."""
    table = schema.metrics
    query = sa.select(table.c.group, table.c.steps_completed, table.c.metrics)
    with engine.connect() as conn:
        found = conn.execute(query.where(table.c.trial_id == trial_id).order_by(table.c.id))
        return [(g, int(s), dict(m)) for g, s, m in found]


@pytest.mark.timeout(240)  # a synchronous write would wait on the lock for ever
def test_reports_return_while_the_database_is_locked_and_land_in_order(registry_url, tmp_path):
    outside = make_engine(registry_url)
    try:
        with init(storage=str(tmp_path / "ckpts"), registry=registry_url) as ctx:
            trial = ctx.trial_id
            with _metrics_locked(outside):
                # Determined's keras callback order at an epoch end: metrics, progress, save
                for step in (1, 2, 3):
                    ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
                ctx.train.report_progress(0.5)
                ctx.train.set_status("checkpointing")
                assert _rows(outside, trial) == []  # every call returned; nothing written yet
            # This registry's own read comes after the writes queued before it.
            assert [(m.group, m.steps_completed) for m in ctx.registry.get_metrics(trial)] == [
                ("training", 1),
                ("training", 2),
                ("training", 3),
            ]
            with _metrics_locked(outside):
                ctx.train.report_training_metrics(4, {"loss": 0.2})
            ctx.train.report_validation_metrics(4, {"val_loss": 0.3})  # after the queued one
            ctx.train.report_training_metrics(5, {"loss": 0.1})
            with ctx.checkpoint.store_path({"steps_completed": 5}) as (path, _):
                Path(path, "weights.bin").write_bytes(os.urandom(64))
            ctx.train.report_metrics("test", 5, {"acc": 0.9})
            ctx.train.report_training_metrics(6, {"loss": 0.05})
        # Exit waited for the last queued write, before the trial's final state.
        assert [(g, s) for g, s, _ in _rows(outside, trial)] == [
            ("training", 1),
            ("training", 2),
            ("training", 3),
            ("training", 4),
            ("validation", 4),
            ("training", 5),
            ("test", 5),
            ("training", 6),
        ]
        with Registry(registry_url) as reg:
            assert reg.get_trial(trial).state == "COMPLETED"
    finally:
        outside.dispose()


def test_a_failed_background_write_raises_its_error_at_the_next_call_and_at_exit(where):
    storage, registry = where
    with init(storage=storage, registry=registry, set_trial_state=False) as ctx:
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        ctx.train.wait()
        with Registry(registry) as other:  # `ckptstore trial delete` from another shell
            other.delete_trial(ctx.trial_id)
        ctx.train.report_training_metrics(2, {"loss": 0.5})  # returns: the write is queued
        with pytest.raises(errors.TrialNotFound, match=str(ctx.trial_id)) as caught:
            ctx.train.report_validation_metrics(2, {"val_loss": 0.4})
        if sys.version_info >= (3, 11):  # exception notes
            assert any("background write" in n for n in caught.value.__notes__)
        ctx.train.report_progress(1.0)  # raised once: the script may carry on
    with pytest.raises(errors.TrialNotFound):
        with init(storage=storage, registry=registry, set_trial_state=False) as ctx:
            with Registry(registry) as other:
                other.delete_trial(ctx.trial_id)
            ctx.train.report_training_metrics(1, {"loss": 1.0})  # its failure ends the block


_OPS = st.lists(
    st.sampled_from(["training", "training", "validation", "other", "read"]),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_any_mix_of_reports_and_reads_sees_the_call_order(where, ops):
    storage, registry = where
    with init(storage=storage, registry=registry) as ctx:
        reported: list[tuple[str, int]] = []
        for i, op in enumerate(ops):
            if op == "read":  # steps are equal, so the registry orders the rows by arrival
                rows = ctx.registry.get_metrics(ctx.trial_id)
                assert [(m.group, m.metrics["seq"]) for m in rows] == reported
                continue
            ctx.train.report_metrics(op, 7, {"seq": i})
            reported.append((op, i))
        trial = ctx.trial_id
    with Registry(registry) as reg:
        assert [(m.group, m.metrics["seq"]) for m in reg.get_metrics(trial)] == reported
