"""Issue 15 item 5: a truncated model.keras loaded by path says it is truncated (it said "File
not found"), as a typed ModelLoadError."""

from __future__ import annotations

import pytest

from ckptstore import errors


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_truncated_keras_file_by_path(tmp_path, keep):
    import keras

    from ckptstore.keras import load_model_from_checkpoint_path

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save(tmp_path / "model.keras")
    data = (tmp_path / "model.keras").read_bytes()
    (tmp_path / "model.keras").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(errors.ModelLoadError, match="truncated or damaged"):
        load_model_from_checkpoint_path(str(tmp_path))
