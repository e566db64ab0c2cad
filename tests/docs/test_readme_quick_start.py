"""The README's quick start runs as written: save the block as ``quick_start.py``, run it, run it
again (it resumes and has nothing left to train), in a fresh default store; and on a bucket.

Issue 39, finding 1: its last line, ``det.load_checkpoint_model(trial_id=7)``, raised
StorageNotAllowed when the registry row named a bucket and the load opened the default local
storage. A load for the user now follows a bucket URL the registry recorded (with the user's own
credentials and endpoint): the S3 test loads trial 7 in a process without
``CKPTSTORE_STORAGE``. Session 14's first hour: the block left ``model``, ``x`` and ``y`` to
the reader and named a bucket, so it did not run as written; it is now whole.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers.fresh_home import ROOT, fresh_home_env
from tests.servers.emulators import create_bucket

#: Trial 7 loaded by another process (the block's ``x = ...`` line comes before it).
LOAD = """
import ckptstore as det
print(det.load_checkpoint_model(trial_id=7).predict(x[:3], verbose=0))
"""


def quick_start() -> str:
    """The python block of the README's "Quick start" section, as written."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=fresh_home_env(tmp_path / "home", **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _predictions(stdout: str) -> str:
    """The ``print(model.predict(...))`` of the block: its last lines."""
    return stdout[stdout.rindex("[[") :]


@pytest.mark.e2e
def test_readme_quick_start_runs_verbatim_twice(tmp_path):
    (tmp_path / "quick_start.py").write_text(quick_start())
    first = _run(tmp_path, "quick_start.py")
    # Said what it did: one INFO line per committed checkpoint, naming the storage.
    assert re.search(r"ckptstore: Checkpoint \S+ committed to file://", first.stderr)
    again = _run(tmp_path, "quick_start.py")
    assert "fit(epochs=10) has no epoch left to train" in again.stderr, again.stderr[-3000:]
    assert "ckptstore: Checkpoint" not in again.stderr  # trained nothing, saved nothing
    assert _predictions(again.stdout) == _predictions(first.stdout)


@pytest.mark.e2e
def test_readme_quick_start_on_a_bucket_loads_from_where_the_registry_says(s3_server, tmp_path):
    code = quick_start()
    assert "load_checkpoint_model(trial_id=7)" in code and "s3://my-bucket/ckpts" in code
    create_bucket(s3_server, "my-bucket")
    (tmp_path / "quick_start.py").write_text(code)
    trained = _run(
        tmp_path, "quick_start.py", CKPTSTORE_STORAGE="s3://my-bucket/ckpts", **s3_server.env
    )
    assert re.search(r"Checkpoint \S+ committed to s3://my-bucket/ckpts", trained.stderr)
    # without CKPTSTORE_STORAGE: the default storage is local, the registry row names the bucket
    data = next(line for line in code.splitlines() if line.startswith("x = "))
    loaded = _run(tmp_path, "-c", "import numpy as np\n" + data + LOAD, **s3_server.env)
    assert _predictions(loaded.stdout) == _predictions(trained.stdout)
    print(trained.stderr[-3000:])
