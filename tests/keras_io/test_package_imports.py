"""``import ckptstore`` stays light; the Determined-style names are reachable lazily."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # starts Python processes that import TensorFlow

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_does_not_load_tensorflow_or_keras():
    got = _run(
        "import json, sys\n"
        "import ckptstore, ckptstore.storage_backends, ckptstore.registry, ckptstore.checkpointing\n"
        "import ckptstore.core, ckptstore.errors\n"
        "from ckptstore.core import _info as trial_info\n"
        "from ckptstore.keras_io import loaders\n"
        "import ckptstore.experiment, ckptstore.import_determined.layouts\n"
        "ckptstore.get_trial_info; ckptstore.get_cluster_info; ckptstore.load_checkpoint_model\n"
        "print(json.dumps(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)))"
    )
    assert got == []


def test_public_names_after_import_ckptstore():
    got = _run(
        "import json, ckptstore as det\n"
        "names = {\n"
        " 'core.init': callable(det.core.init),\n"
        " 'core.DistributedContext.from_tf_config': callable(det.core.DistributedContext.from_tf_config),\n"
        " 'keras.init': callable(det.keras.init),\n"
        " 'keras.load_model_from_checkpoint_path': callable(det.keras.load_model_from_checkpoint_path),\n"
        " 'keras.load_checkpoint_model': det.keras.load_checkpoint_model is det.load_checkpoint_model,\n"
        " 'errors': det.errors.CkptstoreError.__name__ == 'CkptstoreError',\n"
        " 'get_cluster_info': det.get_cluster_info is det.get_trial_info,\n"
        "}\n"
        "print(json.dumps(names))"
    )
    assert all(got.values()), got
