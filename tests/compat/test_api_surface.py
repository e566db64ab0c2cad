"""Every Keras-facing name of Determined 0.38.1 keeps the status docs/determined-compat.md
records for it (same / compatible / not supported ...): a name that disappears or whose
signature stops accepting Determined's calls fails here.

The Determined side comes from the committed snapshot (tests/compat/determined_0_38_1_api.json,
extracted from the real wheel by scripts/determined_api_snapshot.py), so most tests need no wheel;
``test_snapshot_is_what_the_real_wheel_gives`` installs ``determined==0.38.1`` from PyPI into a
side virtualenv and checks the snapshot against it (skipped offline, failing with ``CI=true``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.compat import api_surface


@pytest.fixture(scope="module")
def rows() -> list[api_surface.Row]:
    return api_surface.rows_for(api_surface.load_snapshot())


def test_snapshot_is_determined_0_38_1_with_its_keras_modules():
    snapshot = json.loads(api_surface.SNAPSHOT.read_text())
    assert snapshot["determined_version"] == "0.38.1"
    keras = snapshot["modules"]["determined.keras"]
    # Names every TFKerasTrial example and the DeterminedCallback docs use.
    for name in ("InputData", "TFKerasTrial", "DeterminedCallback", "TFKerasTensorBoard"):
        assert name in keras
    assert keras["load_model_from_checkpoint_path"]["params"][:2] == [
        ["path", "pos", None],
        ["tags", "pos", "None"],
    ]


def test_no_row_is_worse_than_documented(rows):
    documented = api_surface.documented_statuses(api_surface.DOC.read_text())
    assert len(documented) > 400, "docs/determined-compat.md lost its table"
    worse = [
        f"{r.name}: {documented[r.name]} -> {r.status} ({r.notes})"
        for r in rows
        if r.name in documented
        and api_surface.RANK[r.status] > api_surface.RANK[documented[r.name]]
    ]
    vanished = sorted(set(documented) - {r.name for r in rows})
    assert not worse, "Determined compatibility regressed:\n" + "\n".join(worse)
    assert not vanished, f"rows vanished from the comparison: {vanished}"


def test_names_a_determined_keras_script_needs_are_same_or_compatible(rows):
    by_name = {r.name: r for r in rows}
    for name in (
        "determined.LOG_FORMAT",
        "determined.core.DummyDistributedContext",
        "determined.core.DownloadMode",
        "determined.core.PreemptMode",
        "determined.core.TensorboardMode",
        "determined.core.CheckpointContext.restore_path",
        "determined.core.CheckpointContext.download",
        "determined.keras.InputData",
        "determined.keras.load_model_from_checkpoint_path",
        "determined.keras.TFKerasTrialContext.get_stop_requested",
        "determined.keras.TFKerasTrialContext.env",
        "determined.experimental.client.get_checkpoint",
        "determined.experimental.client.Checkpoint.download",
        "determined.experimental.client.Model.register_version",
    ):
        assert by_name[name].status in ("same", "compatible"), by_name[name]


def test_the_comparison_rejects_a_changed_positional_order():
    det = [["path", "pos", None], ["tags", "pos", "None"]]
    assert api_surface.compare_params(det, det) == ("same", "")
    status, notes = api_surface.compare_params(
        det, [["path", "pos", None], ["compile", "pos", "True"]]
    )
    assert status == "different" and "'compile', not 'tags'" in notes
    status, notes = api_surface.compare_params(
        det, [["path", "pos", None], ["tags", "pos", "None"], ["model", "kw", "None"]]
    )
    assert status == "compatible" and "adds model" in notes
    status, _ = api_surface.compare_params(det, [["path", "pos", None]])
    assert status == "different"


def test_the_table_parser_reads_what_render_writes(rows):
    text = api_surface.render(rows)
    assert api_surface.documented_statuses(text) == {r.name: r.status for r in rows}


@pytest.mark.slow
def test_snapshot_is_what_the_real_wheel_gives(tmp_path):
    """The committed snapshot equals what scripts/determined_api_snapshot.py extracts from the
    real determined==0.38.1 wheel, installed into a side virtualenv (never the project's)."""
    venv = tmp_path / "detvenv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    python = str(venv / "bin" / "python")
    # The project's packages are visible to the side venv after its own (a .pth line: read
    # only, their .pth files not run): pip installs only the dependencies of determined that the
    # project lacks or pins otherwise (~30, not ~65: 27 s -> 6 s here) and leaves the project's
    # venv alone ("outside environment"); determined itself is always the wheel's.
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    project = sysconfig.get_paths()["purelib"]
    Path(site_packages, "ckptstore-project-packages.pth").write_text(project + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q",
         "--disable-pip-version-check", "determined==0.38.1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip("cannot install determined==0.38.1: " + install.stderr.strip()[-500:])
    script = api_surface.HERE.parents[1] / "scripts" / "determined_api_snapshot.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    extracted = subprocess.run(
        [python, str(script)], capture_output=True, text=True, timeout=300, env=env, check=True
    )
    real = json.loads(extracted.stdout)
    assert real["determined_version"] == "0.38.1"
    assert real == json.loads(api_surface.SNAPSHOT.read_text()), (
        "tests/compat/determined_0_38_1_api.json differs from the real wheel: regenerate it "
        "(see scripts/determined_api_snapshot.py) and docs/determined-compat.md"
    )
