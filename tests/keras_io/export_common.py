"""What the Keras 3 and Keras 2 export tests (``test_export.py``, ``test_export_keras2.py``) share:
their regression data, training loop, trial context and the "has a SavedModel" check."""

from __future__ import annotations

import numpy as np

import ckptstore as det
from ckptstore.checkpointing import format as fmt

X = np.random.RandomState(1).rand(24, 4).astype("float32")
Y = (X @ np.arange(8, dtype="float32").reshape(4, 2)).astype("float32")


def fit(model, callbacks, epochs):
    model.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)


def init(tmp_path, storage=None):
    """Trial 1's core context on ``storage`` (default: a folder in ``tmp_path``)."""
    return det.core.init(
        storage=storage or str(tmp_path / "ckpts"),
        registry=f"sqlite:///{tmp_path / 'reg.db'}",
        trial_id=1,
        preempt_signals=False,
    )


def has_saved_model(storage, uuid: str) -> bool:
    return "saved_model/saved_model.pb" in fmt.read_manifest(storage, uuid)["files"]


def assert_committed_without_saved_model(ctx, model, caplog, missing: str, fix: str) -> None:
    """Trains ``model`` 2 epochs exporting every checkpoint where the export cannot be made:
    both checkpoints commit without saved_model/ (best effort, issue 38), their metadata says
    why (``missing``), and one warning names ``fix``."""
    import ckptstore as det

    with caplog.at_level("WARNING"):
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="every")
        fit(model, [cb], epochs=2)
        cb.wait()
    rows = ctx.registry.list_checkpoints(trial_id=1)
    assert len(rows) == 2
    for row in rows:
        assert row.metadata["saved_model"] is False
        assert missing in row.metadata["missing"]["saved_model"]
        assert not has_saved_model(ctx.storage, row.uuid)
    warned = [r for r in caplog.records if "saved without their inference SavedModel" in r.message]
    assert len(warned) == 1 and fix in warned[0].message
