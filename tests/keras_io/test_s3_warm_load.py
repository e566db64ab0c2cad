"""A load by UUID and a resume from S3 with a warm restore cache read ``model.keras`` in
place from the cache (issue 41): nothing reassembled or copied, the weights read by HDF5
where they are, the same predictions; a damaged cached file is fetched again."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import ckptstore as det
from ckptstore.checkpointing import cache_view
from ckptstore.checkpointing import format as fmt
from ckptstore.storage_backends import open_storage
from tests.keras_io.test_fast_read import X, Y, assembled, model_with_adam, state, zip_reads

pytestmark = pytest.mark.e2e  # trains a Keras model end to end
__all__ = ["assembled", "zip_reads"]  # fixtures


@pytest.fixture
def cached_views(monkeypatch):
    """The names of the files read through a :class:`cache_view.CachedFile`."""
    names: list[str] = []
    real = cache_view.CachedFile.__init__

    def spy(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
        names.append(name)
        real(self, name, *args, **kwargs)

    monkeypatch.setattr(cache_view.CachedFile, "__init__", spy)
    return names


def test_warm_s3_loads_and_resumes_read_the_cached_file_in_place(
    storage_url_factory, tmp_path, zip_reads, assembled, cached_views, caplog
):
    url, registry = storage_url_factory("s3"), f"sqlite:///{tmp_path / 'reg.db'}"
    trained = model_with_adam(1)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        trained.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
        uuid = cb.last_checkpoint
    assert uuid is not None
    expected = trained.predict(X, verbose=0)

    def load():  # type: ignore[no-untyped-def]
        zip_reads.clear(), assembled.clear(), cached_views.clear()
        model = det.load_checkpoint_model(checkpoint_uuid=uuid, storage=url, registry=registry)
        np.testing.assert_array_equal(model.predict(X, verbose=0), expected)
        return model

    load()  # cold: fetched from S3 into the cache, then read there
    assert assembled == ["model.keras"] and cached_views == [f"{uuid}/model.keras"]
    load()  # warm: read in place from the cache
    assert assembled == [] and cached_views == [f"{uuid}/model.keras"]
    assert "model.weights.h5" not in zip_reads  # HDF5 read the weights where they are

    # A resume on the same machine reads the same cached file in place.
    assembled.clear(), cached_views.clear()
    resumed = model_with_adam(2)
    with det.core.init(storage=url, registry=registry, trial_id=1, preempt_signals=False) as ctx:
        cb = det.keras.DeterminedCallback(ctx, uuid, 1, export_saved_model="never")
        resumed.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert cb.resumed and "model.keras" not in assembled
    assert cached_views == [f"{uuid}/model.keras"]
    for got, want in zip(state(resumed), state(trained), strict=True):
        np.testing.assert_array_equal(got, want)  # nothing trained: 2 epochs were done

    # A damaged cached file: dropped, fetched again, never a wrong model.
    with open_storage(url) as store:
        entry = fmt.load_manifest(store, uuid).files["model.keras"]
    cache = det.checkpointing.cache.RestoreCache()
    path = cache.root / cache.content_key(entry.chunks)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ckptstore.checkpointing.cache"):
        load()
    assert "is damaged; dropped" in caplog.text and assembled == ["model.keras"]
