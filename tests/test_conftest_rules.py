"""The suite's own rules, run on small test files with pytester: with ``CI=true`` any skip fails
(``tests/_helpers/ci_skips.py``), and every test is marked ``unit``, ``servers`` or ``e2e``
(``tests/_helpers/markers.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SKIPPING = """
import pytest

@pytest.fixture
def missing_server():
    pytest.skip("the emulator could not start: port in use")

def test_passes():
    pass

def test_skips_in_its_body():
    pytest.skip("Chromium is not installed")

def test_skips_in_a_fixture(missing_server):
    pass

@pytest.mark.skipif(True, reason="not on this platform")
def test_skipif():
    pass

@pytest.mark.xfail(reason="known bug", strict=True)
def test_expected_failure():
    raise AssertionError

@pytest.mark.keras3_only
def test_deselected_by_marker():
    pytest.skip("would fail in CI if it ran")
"""


def run(pytester: pytest.Pytester, monkeypatch, ci: str | None, *args: str) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    return pytester.runpytest("-p", "tests._helpers.ci_skips", "-p", "no:cacheprovider", *args)


def test_locally_skips_are_skips(pytester, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    run(pytester, monkeypatch, None).assert_outcomes(passed=1, skipped=4, xfailed=1)


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_in_ci_every_skip_fails_with_its_reason(pytester, monkeypatch, ci):
    pytester.makepyfile(test_skipping=SKIPPING)
    result = run(pytester, monkeypatch, ci, "-m", "not keras3_only")
    # a skip in setup (a fixture, skipif) fails as a setup error; the xfail stays an xfail; the
    # test deselected by -m is neither run nor failed
    result.assert_outcomes(passed=1, failed=1, errors=2, xfailed=1, deselected=1)
    for reason in ("Chromium is not installed", "port in use", "not on this platform"):
        result.stdout.fnmatch_lines([f"*skipped with CI=true*{reason}*"])


def test_in_ci_a_deselected_test_is_not_a_failure(pytester, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    result = run(pytester, monkeypatch, "true", "--deselect", "test_skipping.py::test_skipif")
    result.assert_outcomes(passed=1, failed=2, errors=1, xfailed=1, deselected=1)


def test_in_ci_a_module_level_importorskip_fails(pytester, monkeypatch):
    pytester.makepyfile(
        test_needs_package="""
        import pytest
        pytest.importorskip("no_such_package_xyz", reason="pip install -e .[test]")

        def test_never_runs():
            pass
        """
    )
    assert run(pytester, monkeypatch, None).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result = run(pytester, monkeypatch, "true")
    result.assert_outcomes(errors=1)
    assert (
        "skipped with CI=true, where every test must run: pip install -e .[test]"
        in result.stdout.str()
    )


def test_other_ci_values_keep_skips(pytester, monkeypatch):
    pytester.makepyfile(test_skipping=SKIPPING)
    run(pytester, monkeypatch, "false").assert_outcomes(passed=1, skipped=4, xfailed=1)


MARKED = """
import pytest

@pytest.fixture
def s3_server():
    return "s3"

@pytest.fixture
def storage_url_factory():
    return lambda kind: kind

@pytest.fixture(params=["file", "s3"])
def local_and_s3_url(request, storage_url_factory):
    return storage_url_factory(request.param)

@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request):
    return request.param

@pytest.fixture
def browser():
    return "chromium"

def test_plain(tmp_path):
    pass

def test_server(s3_server):
    pass

def test_factory_directly(storage_url_factory):
    pass

def test_urls(local_and_s3_url, registry_url):
    pass

def test_browser(browser):
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.e2e
def test_marked_e2e_with_a_server(s3_server):
    pass
"""


def collected(pytester: pytest.Pytester, marker: str) -> set[str]:
    result = pytester.runpytest(
        "-p", "tests._helpers.markers", "-p", "no:cacheprovider", "--collect-only", "-q",
        "-m", marker,
    )  # fmt: skip
    return {line.split("::", 1)[1] for line in result.outlines if "::" in line}


def test_every_test_gets_unit_servers_or_e2e(pytester):
    pytester.makepyfile(test_marked=MARKED)
    pytester.makeini("[pytest]\nmarkers =\n  e2e\n  slow\n  servers\n  unit\n")
    assert collected(pytester, "unit") == {
        "test_plain",
        "test_urls[file-sqlite]",
    }
    assert collected(pytester, "servers") == {
        "test_server",
        "test_factory_directly",
        "test_urls[file-postgresql]",
        "test_urls[s3-sqlite]",
        "test_urls[s3-postgresql]",
        "test_marked_e2e_with_a_server",
    }
    assert collected(pytester, "e2e") == {
        "test_browser",
        "test_slow",
        "test_marked_e2e_with_a_server",
    }


BESIDE = """
import os, sys
from tests._helpers.child_runs import ChildRun

def _command():
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_heavy.py"]
    return argv, os.getcwd(), dict(os.environ)

RUN = ChildRun("beside", _command, timeout=300, takes_over=("test_heavy.py",))

@RUN.test
def test_beside():
    proc = RUN.passed(at_least=2)
    assert "2 passed" in proc.stdout.splitlines()[-1], proc.stdout
    assert RUN.taken_over == 2
"""


def test_a_child_run_takes_its_modules_over_and_its_test_goes_last(pytester, monkeypatch):
    # tests/test_e2e_beside.py's mechanism (tests/_helpers/child_runs.py), in a fresh process:
    # the plugin's queue is per interpreter
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(
        test_a_beside=BESIDE,
        test_heavy="def test_one():\n    pass\n\ndef test_two():\n    pass\n",
        test_light="def test_light():\n    pass\n",
    )
    args = ("-p", "tests._helpers.child_runs", "-p", "no:cacheprovider", "-v")
    result = pytester.runpytest_subprocess(*args)
    # the heavy module ran in the child only; the child run's test went after test_light
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*test_light.py::test_light PASSED*", "*test_beside PASSED*"])
    # without the child run's test, the session runs the module itself
    result = pytester.runpytest_subprocess(*args, "--deselect", "test_a_beside.py::test_beside")
    result.assert_outcomes(passed=3, deselected=1)
