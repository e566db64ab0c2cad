"""The model-shape corpus (``shape_corpus_worker.py``): every shape trains with
``DeterminedCallback``, is preempted by a real SIGTERM, resumes bit-exactly in a new process,
loads by UUID and predicts what the trained model predicts.

Two processes per Keras version: the first runs each shape straight and preempted (SIGTERM
after step 6 of 8, inside epoch 2), the second resumes each one and loads it. Runs on the Keras
``tf.keras`` is; ``test_keras2_suite.py`` runs it again on Keras 2.
A shape Keras 2 cannot express (``KERAS3_ONLY`` in the worker) is not run there; its Keras 2
cell says why.

The table of shapes x what works in ``docs/reference/model-shapes.md`` is generated from these
results: each run renders its Keras version's column from what it measured and compares it with
the file, so the page cannot drift from the tests. After a behaviour change, regenerate it with
``CKPTSTORE_WRITE_SHAPES_TABLE=1 pytest tests/keras_io/test_shape_corpus.py`` (and the Keras 2
column under ``TF_USE_LEGACY_KERAS=1``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.keras_io.keras_under_test import KERAS_MAJOR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "keras_io", "shape_corpus_worker.py")
TABLE = os.path.join(REPO, "docs", "reference", "model-shapes.md")
COLUMNS = {3: 1, 2: 2}  # table column of each Keras version


def private_worker(workdir) -> str:
    """A copy of the worker that both processes of one test run (taken once, at its start).

    Keras 2's autograph reads a custom layer's ``call`` from the script file when it first
    traces it, at the line its code object was compiled at: an edit of the worker while a run is
    in flight (a save, a merge) that shifts its lines made it convert ``Classifier.__init__``
    instead (``RuntimeError: Exception encountered when calling layer "classifier"``, ``KeyError:
    '__class__'``), and the resuming process would run other shapes than the first one."""
    folder = os.path.join(workdir, "worker")  # its own folder: first on the worker's sys.path
    os.makedirs(folder, exist_ok=True)
    copy = os.path.join(folder, os.path.basename(WORKER))
    shutil.copyfile(WORKER, copy)
    return copy


def run_phase(workdir, phase: str, worker: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, worker, "--dir", str(workdir), "--phase", phase],
        cwd=str(workdir),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {"stderr": proc.stderr}


def load(workdir, phase: str) -> dict:
    with open(os.path.join(workdir, f"{phase}.json")) as f:
        return json.load(f)


def bit_equal(workdir, shape: str) -> bool:
    with np.load(os.path.join(workdir, f"straight-{shape}.npz")) as a:
        with np.load(os.path.join(workdir, f"final-{shape}.npz")) as b:
            if sorted(a.files) != sorted(b.files) or not any(k.startswith("opt/") for k in a):
                return False
            return all(np.array_equal(a[k], b[k]) for k in a.files)


def cell(workdir, shape: str, straight: dict, part: dict, final: dict) -> str:
    """What works for ``shape``, in words (a table cell)."""
    if "keras3_only" in straight:
        return "Keras 3 only: " + straight["keras3_only"]
    if "error" in part or "error" in final:
        return "fails: " + (part.get("error") or final.get("error", ""))[:80].replace("|", "/")
    words = []
    # iterations counts optimizer updates (fewer than steps with gradient accumulation)
    exact = bit_equal(workdir, shape) and final["iterations"] == straight["iterations"]
    restart = part["steps_here"] + final["steps_here"] > 8
    words.append(
        ("resumes bit-exactly" + (" (epoch boundary)" if part["steps_here"] == 4 else ""))
        if exact and not restart
        else "resumes, not bit-exact"
    )
    loaded = final.get("load", {})
    if not loaded.get("without_model", "loaded").startswith("loaded"):
        words.append("weights only: loads with `model=`")
    if loaded.get("predict_equal"):
        words.append("loads by UUID, same predictions")
    else:
        words.append("loads by UUID, predictions differ")
    if final.get("saved_model"):
        words.append("SavedModel")
    for artifact in sorted(final.get("missing", {})):
        words.append(f"no {artifact} (recorded, one warning)")
    return "; ".join(words)


def check_table(column: dict[str, str]) -> None:
    """Compare (or with CKPTSTORE_WRITE_SHAPES_TABLE=1, write) this Keras version's column."""
    with open(TABLE, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    index = COLUMNS[KERAS_MAJOR]
    rows = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\| `([a-z_]+)` \|", line)
        if m:
            rows[m.group(1)] = i
    assert sorted(rows) == sorted(column), (sorted(rows), sorted(column))
    changed = []
    for shape, text_cell in column.items():
        cells = [c.strip() for c in lines[rows[shape]].strip().strip("|").split("|")]
        if cells[index] != text_cell:
            changed.append((shape, cells[index], text_cell))
            cells[index] = text_cell
            lines[rows[shape]] = "| " + " | ".join(cells) + " |"
    if changed and os.environ.get("CKPTSTORE_WRITE_SHAPES_TABLE") == "1":
        with open(TABLE, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return
    assert not changed, (
        f"{TABLE} does not say what the corpus measured on Keras {KERAS_MAJOR} "
        "(regenerate: CKPTSTORE_WRITE_SHAPES_TABLE=1): " + json.dumps(changed, indent=1)
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_shape_resumes_bit_exactly_loads_and_matches_the_docs_table(tmp_path):
    worker = private_worker(tmp_path)
    first = run_phase(tmp_path, "first", worker)
    final_run = run_phase(tmp_path, "final", worker)
    straight, part, final = (load(tmp_path, p) for p in ("straight", "part", "final"))
    column = {s: cell(tmp_path, s, straight[s], part[s], final[s]) for s in straight}
    for shape in (s for s in straight if "keras3_only" not in straight[s]):
        for phase in (straight, part, final):
            assert "error" not in phase[shape], f"{shape}: {phase[shape].get('error')}"
        assert part[shape]["preempted"] and final[shape]["resumed"], shape
        assert bit_equal(tmp_path, shape), f"{shape}: resumed run differs from the straight one"
        assert final[shape]["load"]["predict_equal"], shape
        # a shape loaded with model=: a load without it raises, naming model=, or gives the
        # trained model back (never one missing weights, as Keras 3's reader returned an
        # unbuilt subclass)
        without = final[shape]["load"].get("without_model", "loaded, same predictions")
        assert without in ("ModelLoadError names model=", "loaded, same predictions"), shape
    # finding 1: classes of the training script (__main__) export in-process, the run finishes
    assert final["custom_layer_main"]["saved_model"] is True
    # a config that cannot be saved: weights-only checkpoints, said in metadata, one warning
    # per run naming the fix, and a load without model= says to pass it
    if KERAS_MAJOR == 3:
        assert "model_config" in final["custom_layer_no_config"]["missing"]
        assert final["custom_layer_no_config"]["load"]["without_model"].endswith("model=")
    warned = "saved without their full model"
    without_config = [s for s in final if "model_config" in final[s].get("missing", {})]
    assert first["stderr"].count(warned) == 2 * len(without_config)  # one per run (2 per shape)
    assert "register_keras_serializable" in final_run["stderr"]
    # an export that fails (Keras 3: a stateful RNN's fixed batch fails the export's check)
    # leaves the checkpoint without it; Keras 2's model.save() exports it
    assert ("saved_model" in final["stateful_rnn"]["missing"]) == (KERAS_MAJOR == 3)
    if KERAS_MAJOR == 3:  # SIGTERM after step 6 of 8: 1 update done, 2 gradients accumulated
        assert part["gradient_accumulation"]["iterations"] == 1
        assert final["gradient_accumulation"]["iterations"] == 2
    # XLA ran the train step (Keras 3 turns it off under op determinism unless compiled without)
    assert all(p["jit_compile"]["jit_compile"] for p in (straight, part, final))
    check_user_callbacks(tmp_path, first["stderr"])
    check_table(column)


def check_user_callbacks(workdir, stderr: str) -> None:
    """``user_callbacks``: ``CSVLogger(append=True)`` in the preempted and resumed runs' shared
    file logs the cut epoch twice, the preempted run's row (over the batches it ran) and then the
    resumed run's, equal to the uninterrupted run's row; the user's ``BackupAndRestore`` drew one
    warning and left no backup behind (it deletes it when ``fit()`` stops)."""
    folder = os.path.join(workdir, "user-callbacks")
    rows = {}
    for run in ("straight", "run"):
        with open(os.path.join(folder, run, "log.csv"), encoding="utf-8") as f:
            rows[run] = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows["straight"]] == ["0", "1"]
    assert [r["epoch"] for r in rows["run"]] == ["0", "1", "1"]
    assert rows["run"][0] == rows["straight"][0] and rows["run"][2] == rows["straight"][1]
    assert rows["run"][1] != rows["straight"][1]  # the cut epoch's partial row
    backup = os.path.join(folder, "run", "backup")  # Keras 2 leaves the folder, empty
    assert not os.path.exists(backup) or not os.listdir(backup)
    assert "fit() has BackupAndRestore beside DeterminedCallback" in stderr
