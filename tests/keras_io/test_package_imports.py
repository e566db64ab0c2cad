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
        "from ckptstore.keras_io import loading\n"
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
        "import sys, ckptstore.registry  # a SQLite registry\n"
        "heavy = ('pydantic', 'ckptstore.experiment.config', 'sqlalchemy.dialects.postgresql')\n"
        "names['heavy'] = [m for m in heavy if m in sys.modules]\n"
        "from ckptstore.keras_io.trial.controller import TrialController\n"
        "names['controller'] = det.keras.TFKerasTrial.trial_controller_class is TrialController\n"
        "print(json.dumps(names))"
    )
    # A DeterminedCallback script's start (issue 41): TFKerasTrial's controller (the
    # experiment config, pydantic) and the PostgreSQL dialect load only when used.
    assert got.pop("heavy") == []
    assert all(got.values()), got


#: keras_io's flat modules before the split by concern (0.2), each with a name it must still give.
OLD_KERAS_IO = {
    "determined_callback": "DeterminedCallback",
    "callback_state": "get_rng_state",
    "keras_callback_state": "keras_state",
    "stateful_callbacks": "EarlyStopping",
    "tensorboard": "TensorBoard",
    "mwms_compat": "apply_mwms_compat",
    "snapshot": "take_snapshot",
    "checkpoint_writer": "CheckpointWriter",
    "tf_bundle": "folder_cuts",
    "keras2_format": "load_into",
    "keras_archive": "write_archive",
    "export": "export_checkpoint",
    "loaders": "load_checkpoint_model",
    "resumable_data": "attach",
    "resumable_data_keras2": "attach",
    "keras_context": "KerasContext",
}
#: The public names of the old ``keras_io/export.py``, now split over ``keras_io/exporting/``.
OLD_EXPORT_NAMES = [
    "MODEL_FILENAME",
    "MODES",
    "SAVED_MODEL_DIRNAME",
    "CheckpointExports",
    "ExportPolicy",
    "ExportResult",
    "ExportWorker",
    "custom_modules",
    "export_checkpoint",
    "export_keras2_folder",
    "export_model_file",
]


def test_old_keras_io_paths_import_warn_and_give_their_names():
    got = _run(
        "import importlib, json, warnings\n"
        f"old = {OLD_KERAS_IO!r}\n"
        "out = {}\n"
        "for name, attr in old.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module('ckptstore.keras_io.' + name)\n"
        "    warned = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "    out[name] = [bool(warned) and module.__name__ in warned[0], hasattr(module, attr)]\n"
        "export = importlib.import_module('ckptstore.keras_io.export')\n"
        f"out['export names'] = [n for n in {OLD_EXPORT_NAMES!r} if not hasattr(export, n)]\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from ckptstore.keras_io.loaders import load_model_from_checkpoint_path as old_fn\n"
        "from ckptstore.keras_io.loading import load_model_from_folder\n"
        "out['old loader name'] = [old_fn is load_model_from_folder,\n"
        "    any(w.category is DeprecationWarning for w in caught)]\n"
        "print(json.dumps(out))"
    )
    assert got.pop("export names") == []
    assert got == {name: [True, True] for name in [*OLD_KERAS_IO, "old loader name"]}


def test_old_module_path_still_runs_with_python_m():
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "ckptstore.keras_io.export"]
        + ["--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--worker" in done.stdout
    assert "ckptstore.keras_io.export moved to ckptstore.keras_io.exporting" in done.stderr


def test_the_repository_uses_no_deprecated_import_path():
    import re

    from ckptstore import _deprecated

    patterns = []
    for old in _deprecated.MOVED:
        parent, leaf = old.rsplit(".", 1)
        patterns.append(
            re.compile(
                rf"(?<![\w.]){re.escape(old)}\b|from {re.escape(parent)} import [^\n]*\b{leaf}\b"
            )
        )
    # The table itself, the old loader name's message and this test name old paths on purpose.
    allowed = {
        REPO / "ckptstore" / "_deprecated.py",
        REPO / "ckptstore" / "keras_io" / "loading" / "_loaders.py",
        Path(__file__).resolve(),
    }
    found = []
    for folder in ("ckptstore", "tests", "examples", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path in allowed:
                continue
            text = path.read_text(encoding="utf-8")
            found += [
                f"{path.relative_to(REPO)}: {m.group(0)}"
                for p in patterns
                for m in p.finditer(text)
            ]
    assert found == []
