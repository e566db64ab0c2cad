"""Issue 39, finding 1: the README's quick start runs as written, on the S3 emulator.

Its last line, ``det.load_checkpoint_model(trial_id=7)``, raised StorageNotAllowed: the
registry row named ``s3://my-bucket/ckpts`` and the load opened the default local storage. A
load for the user now follows a bucket URL the registry recorded (with the user's own
credentials and endpoint). The block is taken from README.md verbatim; the test defines only
what the README leaves to the reader (``model``, ``x``, ``y``), with a fresh CKPTSTORE_HOME.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests._helpers.fresh_home import ROOT, fresh_home_env
from tests.servers.emulators import create_bucket

#: What the quick start leaves to the reader: a compiled Keras model and its data.
PREAMBLE = """
import numpy as np
import keras

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
"""

EPILOGUE = """
print("loaded", type(model).__name__, model.predict(x[:2], verbose=0).shape)
"""


def quick_start() -> str:
    """The python block of the README's "Quick start" section, as written."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.e2e
def test_readme_quick_start_runs_verbatim_on_s3(s3_server, tmp_path):
    code = quick_start()
    assert "load_checkpoint_model(trial_id=7)" in code and "s3://my-bucket/ckpts" in code
    create_bucket(s3_server, "my-bucket")
    (tmp_path / "quick_start.py").write_text(PREAMBLE + code + EPILOGUE)
    env = fresh_home_env(tmp_path / "home", **s3_server.env)
    done = subprocess.run(
        [sys.executable, "quick_start.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "loaded Sequential (2, 1)" in done.stdout
    # Said what it did: one INFO line per committed checkpoint, naming the storage.
    assert re.search(r"Checkpoint \S+ committed to s3://my-bucket/ckpts", done.stderr)
    print(done.stderr[-3000:])
