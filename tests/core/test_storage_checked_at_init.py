"""Issue 39, finding 5: a missing bucket showed up only at the first commit (after a whole
epoch) and left a PENDING row for ever; core.init now asks the storage first, with the same
typed errors, before any trial row is written."""

from __future__ import annotations

import uuid

import pytest

import ckptstore
from ckptstore import errors
from ckptstore.registry import Registry


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_missing_bucket_fails_core_init_with_the_typed_error(kind, storage_url_factory, tmp_path):
    existing = storage_url_factory(kind)  # starts the emulator, sets its environment
    scheme = existing.split("://", 1)[0]
    missing = f"{scheme}://no-such-bucket-{uuid.uuid4().hex[:10]}/ckpts"
    registry = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(errors.StorageNotFound):
        with ckptstore.core.init(storage=missing, registry=registry, preempt_signals=False):
            pass
    with Registry(registry) as reg:
        assert reg.list_trials() == [] and reg.list_checkpoints() == []
    with ckptstore.core.init(storage=existing, registry=registry, preempt_signals=False) as ctx:
        assert ctx.trial_id == 1  # a storage that is there opens as before
