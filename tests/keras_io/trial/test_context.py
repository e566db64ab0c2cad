"""TFKerasTrialContext: hyperparameters, config, configure_fit merging, wrappers."""

import pytest

from ckptstore import errors
from ckptstore.keras import TFKerasTrialContext


def test_configure_fit_later_calls_keep_earlier_settings():
    ctx = TFKerasTrialContext({"global_batch_size": 8})
    ctx.configure_fit(verbose=False, workers=5)
    ctx.configure_fit(use_multiprocessing=True)
    ctx.configure_fit(class_weight={0: 1.0, 1: 2.0}, validation_steps=3)
    ctx.configure_fit(class_weight=None)  # None is a real value for class_weight
    fit = ctx.fit_config
    assert fit["workers"] == 5
    assert fit["use_multiprocessing"] is True
    assert fit["verbose"] is False
    assert fit["class_weight"] is None
    assert fit["validation_steps"] == 3
    ctx.configure_fit(shuffle=False)
    assert ctx.fit_config["validation_steps"] == 3 and ctx.fit_config["shuffle"] is False


def test_configure_fit_rejects_bad_values():
    ctx = TFKerasTrialContext({"global_batch_size": 8})
    with pytest.raises(errors.InvalidConfig, match="workers=-1"):
        ctx.configure_fit(workers=-1)
    with pytest.raises(errors.InvalidConfig, match="validation_steps=0"):
        ctx.configure_fit(validation_steps=0)


def test_hparams_and_config():
    config = {"data": {"url": "x"}, "searcher": {"name": "single"}}
    ctx = TFKerasTrialContext({"global_batch_size": 8, "lr": 0.1}, experiment_config=config)
    assert ctx.get_hparam("lr") == 0.1
    assert ctx.get_hparams() == {"global_batch_size": 8, "lr": 0.1}
    assert ctx.get_data_config() == {"url": "x"}
    assert ctx.get_experiment_config()["searcher"] == {"name": "single"}
    assert ctx.get_global_batch_size() == 8 and ctx.get_per_slot_batch_size() == 8
    assert ctx.distributed.get_size() == 1 and ctx.experimental is not None
    with pytest.raises(errors.InvalidConfig, match="'nope' is not defined.*global_batch_size"):
        ctx.get_hparam("nope")


def test_env_keeps_assigned_cluster_fields_and_agrees_with_the_context():
    ctx = TFKerasTrialContext({"global_batch_size": 8}, trial_id=4, trial_seed=7)
    ctx.env.container_gpus = []  # Determined 0.17 trial code did this
    ctx.env.slot_ids = [0]
    assert ctx.env is ctx.env and ctx.env.container_gpus == [] and ctx.env.slot_ids == [0]
    ctx.initial_batch = 12
    assert (ctx.env.det_trial_id, ctx.env.trial_seed, ctx.env.steps_completed) == ("4", 7, 12)
    assert ctx.env.global_batch_size == 8 and ctx.env.hparams == ctx.get_hparams()
    with pytest.raises(errors.InvalidConfig, match=r"env.hparams = \{'lr': 1\}"):
        ctx.env.hparams = {"lr": 1}
    assert ctx.get_hparams() == {"global_batch_size": 8}


def test_bad_global_batch_size():
    with pytest.raises(errors.InvalidConfig, match="global_batch_size='8'"):
        TFKerasTrialContext({"global_batch_size": "8"}).get_global_batch_size()
    # Determined's exception for both cases, reachable as det.errors.InvalidExperimentException.
    import ckptstore as det

    with pytest.raises(det.errors.InvalidExperimentException, match=r"Received: .*\['lr'\]"):
        TFKerasTrialContext({"lr": 0.1}).get_global_batch_size()
    with pytest.raises(det.errors.InvalidExperimentException, match="global_batch_size=0"):
        TFKerasTrialContext({"global_batch_size": 0}).get_per_slot_batch_size()


def test_wrap_dataset_shards_with_several_workers():
    import tensorflow as tf

    class TwoWorkers:
        def get_size(self):
            return 2

        def get_rank(self):
            return 1

    ds = tf.data.Dataset.range(6)
    ctx = TFKerasTrialContext({"global_batch_size": 8}, distributed=TwoWorkers())
    assert list(ctx.wrap_dataset(ds).as_numpy_iterator()) == [1, 3, 5]
    assert len(list(ctx.wrap_dataset(ds, shard_dataset=False))) == 6
    assert ctx.get_per_slot_batch_size() == 4
