"""Keras 3 on JAX or PyTorch where TensorFlow is not installed (issue 42): ``import ckptstore.keras``
works, ``DeterminedCallback`` trains, commits, resumes and loads, and the SavedModel, which Keras
exports through TensorFlow, is left out with one warning naming the fix.

The child sees the suite's site-packages through a folder of links that leaves out TensorFlow,
tf_keras and TensorBoard (``python -S``: no site-packages of its own), so TensorFlow is absent as
it is for a ``pip install keras jax`` user, not hidden behind an import hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from tests._helpers.jax_env import JAX_DIR, REPO, TORCH_DIR, require_backend

#: Distributions a Keras 3 user on JAX or PyTorch does not have.
TENSORFLOW_FAMILY = ("tensorflow", "_tensorflow", "tf_keras", "tensorboard")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import keras
    import ckptstore as det

    epochs = int(sys.argv[1])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(48, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(12, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    with det.core.init(trial_id=11) as ctx:
        cb = det.keras.DeterminedCallback(
            ctx, checkpoint=ctx.info.latest_checkpoint, continue_id=11
        )
        model.fit(x, y, batch_size=8, epochs=epochs, callbacks=[cb], verbose=0)
    loaded = det.load_checkpoint_model(trial_id=11)
    same = np.allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    print(json.dumps({
        "steps": int(model.optimizer.iterations.numpy()),
        "same_predictions": bool(same),
        "tensorflow_imported": "tensorflow" in sys.modules,
    }))
    """
)


def _site_without_tensorflow(folder: str) -> str:
    """A folder linking every entry of this interpreter's site-packages but TensorFlow's family."""
    site = sysconfig.get_paths()["purelib"]
    os.makedirs(folder)
    for name in os.listdir(site):
        if not name.startswith(TENSORFLOW_FAMILY):
            os.symlink(os.path.join(site, name), os.path.join(folder, name))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_run_without_tensorflow_commits_resumes_and_loads(backend: str, tmp_path) -> None:
    require_backend(backend)
    site = _site_without_tensorflow(str(tmp_path / "site"))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    folder = JAX_DIR if backend == "jax" else TORCH_DIR
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        CKPTSTORE_HOME=str(tmp_path / "home"),
        PYTHONPATH=os.pathsep.join([site, folder, REPO]),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.pop("CKPTSTORE_STORAGE", None)
    env.pop("CKPTSTORE_REGISTRY", None)
    results = []
    for epochs in (2, 3):
        proc = subprocess.run(
            [sys.executable, "-S", str(script), str(epochs)],
            env=env,
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        warnings = [line for line in proc.stderr.splitlines() if "without saved_model/" in line]
        assert len(warnings) == 1, proc.stderr[-3000:]
        assert "tensorflow-cpu" in warnings[0] and "export_saved_model='never'" in warnings[0]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    # 48 samples / 8 = 6 steps an epoch: the second run resumed at step 12 and ran one epoch
    assert [r["steps"] for r in results] == [12, 18]
    assert all(r["same_predictions"] and not r["tensorflow_imported"] for r in results)
    store = tmp_path / "home" / "checkpoints"
    uuids = [d for d in os.listdir(store) if (store / d / "MANIFEST.json").exists()]
    assert uuids
    for uuid in uuids:
        manifest = (store / uuid / "MANIFEST.json").read_text()
        assert "model.keras" in manifest and "saved_model/" not in manifest
        metadata = json.loads((store / uuid / "metadata.json").read_text())
        assert metadata["keras_backend"] == backend and metadata["saved_model"] is False
