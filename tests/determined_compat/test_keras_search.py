"""A Core API script giving each searcher operation its own ``model.fit()`` call with a new
``DeterminedCallback`` (``corpus/keras_search``), under ``adaptive_asha`` with
``max_length: {epochs: N}`` and cluster-only keys (``resources.resource_pool``,
``bind_mounts``: ignored with one warning): the calls of a trial count on as one run, and a trial
preempted in its second call resumes in it."""

import pytest

from ckptstore.registry import Registry
from tests.determined_compat import conftest as corpus

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end

BATCHES_PER_EPOCH = 4  # 64 records, batch 16
LENGTH = 4 * BATCHES_PER_EPOCH  # max_length: 4 epochs; the rungs are 2 and 4 epochs


def _steps(registry):
    """``{trial id: (training steps reported, checkpoint steps)}``."""
    with Registry(registry) as reg:
        return {
            t.id: (
                [m.steps_completed for m in reg.get_metrics(t.id, "training")],
                sorted(c.steps_completed for c in reg.list_checkpoints(trial_id=t.id)),
            )
            for t in reg.list_trials(1)
            if t.state == "COMPLETED"
        }


def test_a_fit_call_per_operation_counts_on(tmp_path, where):
    storage, registry = where
    model_dir = corpus.copy_corpus("keras_search", tmp_path)
    done = corpus.create_ok("adaptive.yaml", model_dir, storage, registry)
    assert "bind_mounts" in done.stderr and "resources.resource_pool" in done.stderr
    trials = _steps(registry)
    assert len(trials) == 2
    # the first trial is promoted at the rung (the only one there): a second fit() call, whose
    # epochs and steps go on from the first's instead of starting again at 0
    train, ckpts = trials[1]
    epochs = [BATCHES_PER_EPOCH * (e + 1) for e in range(4)]
    assert train == epochs and ckpts == epochs


def test_preempted_in_the_second_fit_call_resumes_in_it(tmp_path, where):
    storage, registry = where
    model_dir = corpus.copy_corpus("keras_search", tmp_path)

    def in_second_call(reg):
        latest = reg.latest_checkpoint(1)
        return latest is not None and latest.steps_completed > 2 * BATCHES_PER_EPOCH

    corpus.create_then_sigterm(
        "adaptive.yaml", model_dir, storage, registry, in_second_call, KERAS_SEARCH_SLEEP="0.3"
    )
    cut = corpus.paused_at(registry)
    assert 2 * BATCHES_PER_EPOCH < cut < LENGTH
    corpus.resume_ok(model_dir, storage, registry)
    train, ckpts = _steps(registry)[1]
    # the re-run passed the first call (trained nothing) and went on in the second
    assert max(train) == LENGTH and ckpts[-1] == LENGTH
    before = [s for s in train if s <= cut]
    assert (
        before == sorted(set(before)) == list(range(BATCHES_PER_EPOCH, cut + 1, BATCHES_PER_EPOCH))
    )
