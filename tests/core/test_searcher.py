"""core_context.searcher: operations per rung, stopping when the searcher says so, the rules
Determined's SearcherOperation enforces, workers following the chief, and 0.38-style scripts
judged from their validation reports."""

import json
import threading

import pytest

from ckptstore import errors
from ckptstore.core import SearcherContext, SearcherMode, Unit
from ckptstore.core._distributed import DistributedContext
from ckptstore.core._searcher import ORACLE_ENV, SEARCHER_ENV
from tests._helpers.ports import free_port


class Single:
    rank, size = 0, 1

    def broadcast(self, obj):
        return obj


def _run(context, metrics):
    lengths = []
    for op, metric in zip(context.operations(), metrics, strict=False):
        lengths.append(op.length)
        op.report_progress(op.length / 2)
        op.report_completed(metric)
    return lengths


def test_rungs_until_the_oracle_stops():
    asked = []

    def oracle(length, value):
        asked.append((length, value))
        return length == 32

    context = SearcherContext(Single(), [16, 32, 64], oracle=oracle)
    assert _run(context, [3.0, 2.0, 1.0]) == [16, 32]
    assert asked == [(16, 3.0), (32, 2.0)]
    # Never asked about the last rung: that is the end of training anyway.
    assert _run(SearcherContext(Single(), [16, 32, 64], oracle=lambda n, v: False), [1, 1, 1]) == [
        16,
        32,
        64,
    ]


def test_operation_rules():
    context = SearcherContext(Single(), [10])
    ops = context.operations()
    op = next(ops)
    op.report_completed(0.5)
    with pytest.raises(errors.InvalidConfig, match="twice"):
        op.report_completed(0.5)
    with pytest.raises(errors.InvalidConfig, match="after op.report_completed"):
        op.report_progress(3)
    with pytest.raises(errors.InvalidConfig, match="Received: 'high'"):
        next(SearcherContext(Single(), [10]).operations()).report_completed("high")
    skipped = SearcherContext(Single(), [10]).operations()
    next(skipped)
    with pytest.raises(errors.InvalidConfig, match="without op.report_completed"):
        next(skipped)


def test_from_env_outside_an_experiment_is_one_op_of_length_1():
    context = SearcherContext.from_env(Single(), environ={})
    assert [op.length for op in context.operations() if not op.report_completed(0)] == [1]
    assert context.get_configured_units() is None


def test_from_env_reads_the_runner_shape_and_oracle():
    env = {
        SEARCHER_ENV: json.dumps(
            {"name": "adaptive_asha", "metric": "val_loss", "unit": "epochs", "rungs": [2, 8]}
        ),
        ORACLE_ENV: "tests.core.test_searcher:stop_everything",
    }
    context = SearcherContext.from_env(Single(), environ=env)
    assert context.get_configured_units() is Unit.EPOCHS
    assert _run(context, [1.0, 1.0]) == [2]
    with pytest.raises(errors.InvalidConfig, match="CKPTSTORE_SEARCHER must hold JSON"):
        SearcherContext.from_env(Single(), environ={SEARCHER_ENV: "{nope"})


def stop_everything():
    return lambda length, value: True


class Stopper:
    def __init__(self):
        self.requested = 0

    def request_preemption(self):
        self.requested += 1


def test_validation_reports_are_judged_once_per_rung():
    asked = []
    context = SearcherContext(
        Single(), [16, 32, 64], oracle=lambda n, v: asked.append(n) or n == 32
    )
    context._unit_key, context._metric = "batches", "loss"
    stopper = Stopper()
    context.on_validation(8, {"val_loss": 1.0}, stopper)  # before the first rung
    context.on_validation(24, {"val_loss": 0.9, "batches": 24}, stopper)  # past 16
    context.on_validation(30, {"val_loss": 0.8}, stopper)  # still 16: judged already
    assert asked == [16] and stopper.requested == 0
    context.on_validation(40, {"val_loss": 0.7}, stopper)  # past 32: stopped
    assert asked == [16, 32] and stopper.requested == 1


def test_workers_follow_the_chief():
    port = free_port()
    seen = {}

    def worker(rank):
        dist = DistributedContext(rank=rank, size=2, chief_ip="127.0.0.1", port=port)
        try:
            context = SearcherContext(dist, [16, 32, 64], oracle=lambda n, v: n == 32)
            lengths = []
            for op in context.operations(SearcherMode.WorkersAskChief):
                lengths.append(op.length)
                if rank == 0:
                    op.report_completed(1.0)
            seen[rank] = lengths
        finally:
            dist.close()

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {0: [16, 32], 1: [16, 32]}
