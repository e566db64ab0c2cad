"""The one CI rule: with ``CI=true`` a skipped test fails, with the skip's reason.

Locally a test that needs a missing server, browser or package skips and says what is missing;
CI has everything installed (``scripts/install_test_servers.sh``, ``pip install -e .[test]``), so
there a skip means coverage silently lost. Tests and fixtures just call ``pytest.skip(reason)``
(or ``pytest.importorskip``); this plugin, loaded by ``tests/conftest.py``, turns the skip into a
failure. Deselected tests (``-m``, ``--deselect``, ``collect_ignore``) are not skips and stay out.
An expected failure (``xfail``) is not a skip either.
"""

from __future__ import annotations

import os

import pytest

#: Printed before the skip's own reason.
CI_PREFIX = "skipped with CI=true, where every test must run"


def in_ci() -> bool:
    """``CI=true`` (any case), as CI services set it."""
    return os.environ.get("CI", "").lower() == "true"


def _reason(longrepr: object) -> str:
    # A skip's longrepr is (path, line, "Skipped: reason"); keep whatever else as text.
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail(report: pytest.TestReport | pytest.CollectReport) -> None:
    report.outcome = "failed"
    report.longrepr = f"{CI_PREFIX}: {_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    # A module-level skip (pytest.importorskip at import) skips while collecting.
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and in_ci():
        _fail(report)
