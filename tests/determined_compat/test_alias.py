"""``import determined`` resolves to ckptstore only inside processes ckptstore starts
(``ckptstore run``, experiment trials); a real ``determined`` installed alongside is used
everywhere else, and inside one warning names what is in use."""

import os
import subprocess
import sys

import pytest

from tests.determined_compat.conftest import REPO, ckptstore

pytestmark = pytest.mark.e2e  # runs the ckptstore command in processes, trials end to end

PROBE = (
    "import determined, determined.keras, determined.core\n"
    "from determined.keras import TFKerasTrial\n"
    "import ckptstore, ckptstore.keras\n"
    "print('SAME', determined is ckptstore, determined.keras is ckptstore.keras,\n"
    "      TFKerasTrial is ckptstore.keras.TFKerasTrial, ckptstore.keras.__spec__.name)\n"
    "import determined.launch.tensorflow as launcher\n"
    "print('LAUNCHER', launcher.__name__)\n"
)


def _fake_real_determined(tmp_path):
    """A stand-in for the real wheel: a `determined` package on the user's PYTHONPATH."""
    site = tmp_path / "site"
    (site / "determined").mkdir(parents=True)
    (site / "determined" / "__init__.py").write_text("REAL = 'the real determined'\n")
    return site


def test_real_determined_is_not_shadowed_outside(tmp_path):
    site = _fake_real_determined(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(site)]))
    out = subprocess.run(
        [sys.executable, "-c", "import ckptstore, determined; print(determined.REAL)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "the real determined"


def test_inside_ckptstore_run_determined_is_ckptstore(tmp_path, where):
    storage, registry = where
    site = _fake_real_determined(tmp_path)
    (tmp_path / "probe.py").write_text(PROBE)
    done = ckptstore(
        "run",
        "--",
        "python3",
        "probe.py",
        storage=storage,
        registry=registry,
        cwd=tmp_path,
        PYTHONPATH=os.pathsep.join([str(REPO), str(site)]),
    )
    assert done.returncode == 0, done.stderr
    assert "SAME True True True ckptstore.keras" in done.stdout
    assert "LAUNCHER ckptstore.launch.tensorflow" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "`import determined`" in line]
    assert len(warnings) == 1
    assert "set up by `ckptstore run`" in warnings[0]
    assert f"installed at {site / 'determined'} is NOT used" in warnings[0]


def test_ckptstore_run_passes_the_exit_status_and_trial(tmp_path, where):
    storage, registry = where
    (tmp_path / "t.py").write_text(
        "import sys, determined as det\n"
        "info = det.get_cluster_info()\n"
        "sys.exit(40 + info.trial.trial_id)\n"
    )
    done = ckptstore(
        "run",
        "--trial-id",
        "2",
        "--",
        "python3",
        "t.py",
        storage=storage,
        registry=registry,
        cwd=tmp_path,
    )
    assert done.returncode == 42, done.stderr
