"""How a TFKerasTrial's training data is split between the workers of ``slots_per_trial: N``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.keras_io.trial import data as data_mod
from ckptstore.keras_io.trial.sequences import InMemorySequence


def _rows(size: int, rank: int, n: int, gbs: int, batches: int, start=None) -> list[list[int]]:
    x = np.arange(n, dtype="float32").reshape(n, 1)
    train = data_mod.training_data(
        (x, np.zeros(n)), batch_size=gbs, shuffle=True, seed=3, rank=rank, size=size
    )
    if start is not None:
        train.restore(start)
    return [train.next_batch()[0][:, 0].astype(int).tolist() for _ in range(batches)]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(4, 40),
    gbs=st.integers(2, 12),
    size=st.integers(2, 4),
    skip=st.integers(0, 12),
)
def test_workers_share_each_global_batch_and_resume_on_any_count(n, gbs, size, skip):
    """The N workers' batches are the one-worker global batch, split; a position saved by N
    workers means the same global batch for one worker (a 2 -> 1 resume reads on exactly)."""
    batches = 2 * (-(-n // gbs)) + 1  # across a pass boundary: the per-pass shuffle agrees
    alone = _rows(1, 0, n, gbs, batches)
    parts = [_rows(size, rank, n, gbs, batches) for rank in range(size)]
    for b, whole in enumerate(alone):
        assert sorted(sum((p[b] for p in parts), [])) == sorted(whole)
        assert all(len(p[b]) in (len(whole) // size, -(-len(whole) // size)) for p in parts)
    per_pass, skip = -(-n // gbs), skip % batches
    position = {"pass": skip // per_pass, "batch": skip % per_pass}
    assert _rows(1, 0, n, gbs, 1, start=position) == alone[skip : skip + 1]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_sequence_on_several_workers_is_sharded_by_batch_index(shuffle):
    """Issue 38: a Sequence on 2 workers (per-slot batches, as Determined's): at each step the
    workers read two different batches of the pass, together every batch of it (a remainder
    smaller than the worker count skipped), and a position saved mid-pass resumes each worker
    at exactly its next batch."""
    x = np.arange(10, dtype="float32")[:, None]  # 5 batches of 2: 2 steps of 2 workers
    seq = InMemorySequence(x, np.zeros(10), batch_size=2)

    def read(rank, steps, position=None):
        data = data_mod.training_data(seq, batch_size=4, shuffle=shuffle, seed=3, rank=rank, size=2)
        if position:
            data.restore(position)
        return [tuple(data.next_batch()[0][:, 0].tolist()) for _ in range(steps)], data

    (r0, d0), (r1, _) = read(0, 4), read(1, 4)
    assert d0.batches_per_pass == 2
    for p in (0, 1):  # each pass: 4 different batches of the 5, the same on both workers
        seen = set(r0[2 * p : 2 * p + 2]) | set(r1[2 * p : 2 * p + 2])
        assert len(seen) == 4
    resumed, _ = read(0, 2, {"pass": 0, "batch": 1})
    assert resumed == r0[1:3]
    with pytest.raises(errors.InvalidConfig, match="fewer than the 2 workers"):
        data_mod.training_data(
            InMemorySequence(x[:2], np.zeros(2), batch_size=2),
            batch_size=4,
            shuffle=False,
            seed=0,
            rank=0,
            size=2,
        )
