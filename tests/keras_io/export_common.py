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
