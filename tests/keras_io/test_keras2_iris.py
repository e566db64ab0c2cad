"""Determined's Keras 2 Iris script (examples/iris_keras2/train.py, only the import changed) on
tf_keras: trains as a trial, is SIGTERMed, resumes, and its checkpoint is loaded by UUID for batch
inference and with Determined's own ``model.load_weights(path / "model_checkpoint")``.

Each step is its own process with ``TF_USE_LEGACY_KERAS=1``, so this runs in the Keras 3 session.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "iris_keras2", "train.py")

LOAD = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
sys.path.insert(0, {example!r})
import ckptstore
from ckptstore.checkpointing import CheckpointContext
from ckptstore.storage_backends import open_storage
from train import read_split

x, y = read_split(validation=True)
model = ckptstore.load_checkpoint_model(
    checkpoint_uuid={uuid!r}, storage={storage!r}, registry={registry!r}
)
by_uuid = np.asarray(model.predict(x, verbose=0))

# Determined's documented way: build the model in code, load_weights(path / "model_checkpoint")
ctx = CheckpointContext(open_storage({storage!r}))
ctx.download({uuid!r}, {download!r})
inputs = tf.keras.layers.Input(shape=(4,))
hidden = tf.keras.layers.Dense(16)(inputs)
rebuilt = tf.keras.models.Model(inputs, tf.keras.layers.Dense(3, activation="softmax")(hidden))
rebuilt.load_weights(os.path.join({download!r}, "model_checkpoint")).expect_partial()
by_weights = np.asarray(rebuilt.predict(x, verbose=0))
print(json.dumps({{
    "keras": type(model).__module__.split(".")[0],
    "accuracy": float((by_uuid.argmax(1) == y.argmax(1)).mean()),
    "max_diff": float(np.abs(by_uuid - by_weights).max()),
}}))
"""

# Keras 3 (no TF_USE_LEGACY_KERAS) picks up the Keras 2 checkpoint: DeterminedCallback warm-starts
# through the migration code, and the checkpoint's Keras 2 SavedModel serves predictions.
KERAS3 = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "0"  # the example's module defaults it to 1 on import
import numpy as np
import keras
sys.path.insert(0, {example!r})
import ckptstore as det
from ckptstore.checkpointing import CheckpointContext
from ckptstore.storage_backends import open_storage
from train import read_split

x, y = read_split(validation=True)
inputs = keras.Input((4,))
hidden = keras.layers.Dense(16)(inputs)
model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
model.compile(keras.optimizers.RMSprop(0.01), "categorical_crossentropy")
with det.core.init(storage={storage!r}, registry={registry!r}, trial_id=2) as ctx:
    cb = det.keras.DeterminedCallback(ctx, checkpoint={uuid!r}, continue_id=2)
    model.fit(x, y, epochs=0, verbose=0, callbacks=[cb])
warm = np.asarray(model.predict(x, verbose=0))
ctx = CheckpointContext(open_storage({storage!r}))
ctx.download({uuid!r}, {download!r})
served = np.asarray(det.keras.load_model_from_checkpoint_path({download!r}).predict(x))
print(json.dumps({{"keras": keras.__version__, "max_diff": float(np.abs(warm - served).max())}}))
"""


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    env.update(
        CKPTSTORE_TRIAL_ID="1",
        CKPTSTORE_STORAGE=str(tmp_path / "ckpts"),
        CKPTSTORE_REGISTRY=f"sqlite:///{tmp_path / 'registry.db'}",
        CKPTSTORE_HPARAMS=json.dumps(
            {
                "learning_rate": 0.02,
                "learning_rate_decay": 1e-6,
                "layer1_dense_size": 16,
                "global_batch_size": 16,
            }
        ),
    )
    return env


def _done_line(output: str) -> dict[str, str]:
    match = re.search(r"IRIS DONE (.*)", output)
    assert match, output[-4000:]
    return dict(part.split("=", 1) for part in match.group(1).split())


@pytest.mark.slow
def test_iris_keras2_sigterm_resume_load_by_uuid(tmp_path):
    env = _env(tmp_path)
    tb_dir = tmp_path / "ckpts" / "tensorboard" / "1"
    first = subprocess.Popen(
        [sys.executable, TRAIN, "--epochs", "8", "--step-delay", "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    # the TensorBoard callback syncs at every epoch end: once it has, training is under way
    while not (tb_dir.is_dir() and any(tb_dir.rglob("*.tfevents.*"))):
        assert first.poll() is None, first.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "no epoch finished in time"
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=180)
    assert first.returncode == 0, out[-4000:]
    stopped = _done_line(out)
    assert stopped["preempted"] == "True" and stopped["checkpoint"] != "None", stopped

    ckpt = tmp_path / "ckpts" / stopped["checkpoint"]
    # The manifest lists every file (a deduplicated folder keeps most of them as chunks).
    names = set(json.loads((ckpt / "MANIFEST.json").read_text())["files"]) | {"MANIFEST.json"}
    assert {
        "model_checkpoint.index",
        "callback_state.json",
        "metadata.json",
        "MANIFEST.json",
    } <= names
    assert any(n.startswith("model_checkpoint.data-") for n in names)
    meta = json.loads((ckpt / "metadata.json").read_text())
    assert meta["framework"].startswith("tf_keras-2.") and meta["keras_version"].startswith("2.")
    assert meta["continue_id"] == 1

    second = subprocess.run(
        [sys.executable, TRAIN, "--epochs", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    resumed = _done_line(second.stdout)
    assert resumed["resumed"] == "True" and resumed["preempted"] == "False"
    # 120 flowers / 16 per batch = 8 steps an epoch; the epoch cut by SIGTERM continues at its
    # next unseen batch (exact mid-epoch resume on Keras 2), so no batch is trained twice
    assert int(resumed["steps"]) == 8 * 8
    assert "restarts from its first batch" not in second.stderr
    final = tmp_path / "ckpts" / resumed["checkpoint"]
    assert (final / "saved_model" / "saved_model.pb").is_file()

    def run_script(template: str, env: dict[str, str], download: str) -> dict:
        code = template.format(
            example=os.path.dirname(TRAIN),
            uuid=resumed["checkpoint"],
            storage=str(tmp_path / "ckpts"),
            registry=f"sqlite:///{tmp_path / 'registry.db'}",
            download=str(tmp_path / download),
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    result = run_script(LOAD, env, "download")
    assert result["keras"] == "tf_keras"
    assert result["accuracy"] > 0.6
    assert result["max_diff"] < 1e-5  # the SavedModel and the TF checkpoint hold the same weights

    result = run_script(
        KERAS3, {k: v for k, v in env.items() if k != "TF_USE_LEGACY_KERAS"}, "download3"
    )
    assert result["keras"].startswith("3.")
    assert result["max_diff"] < 1e-5
