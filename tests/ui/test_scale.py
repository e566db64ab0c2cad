"""The UI over a registry of 1,000 trials in experiments and 100 script runs, 110,000 checkpoints (built with bulk SQL
inserts): every page answers with one page of rows, and the SQL sort/filter agrees with the
same rule computed in Python. Render times are measured by benchmarks/ui_pages.py, not here."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from ckptstore.registry import Registry, schema
from ckptstore.ui.app import create_app
from ckptstore.ui.queries import PAGE_SIZE
from ckptstore.ui.settings import UiSettings
from tests.ui.scale_registry import build_scale_registry

pytestmark = pytest.mark.e2e  # builds a registry of 100,000 checkpoints


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ui-scale")
    url = f"sqlite:///{folder / 'registry.db'}"
    counts = build_scale_registry(url, script_runs=100)
    assert counts["trials"] == 1100 and counts["checkpoints"] == 110_000
    settings = UiSettings(
        registry_url=url, storage_url=str(folder / "store"), allowed_hosts=("testserver",)
    )
    with TestClient(create_app(settings)) as client:
        yield url, client


def _validation_best(url: str, experiment_id: int) -> dict[int, float]:
    """Best val_loss per trial, computed in Python from every reported row."""
    t, m = schema.trials, schema.metrics
    query = (
        sa.select(m.c.trial_id, m.c.metrics)
        .join(t, t.c.id == m.c.trial_id)
        .where(t.c.experiment_id == experiment_id, m.c.group == "validation")
    )
    with Registry(url) as registry:
        rows = registry.read(lambda c: c.execute(query).all(), what="read metrics")
    best: dict[int, float] = {}
    for trial_id, metrics in rows:
        best[trial_id] = min(best.get(trial_id, float("inf")), metrics["val_loss"])
    return best


def test_every_page_answers_with_one_page_of_rows(scale):
    url, client = scale
    with Registry(url) as registry:
        uuid = registry.list_checkpoints(trial_id=1, states=("COMMITTED",))[0].uuid
    for path, rows in (
        ("/", r'class="run-row"'),
        ("/experiments", r'href="/experiments/\d+"'),
        ("/experiments/1?compare=1&compare=2&compare=3", r'class="trial-row"'),
        ("/experiments/1", r'class="trial-row"'),
        ("/experiments/1?sort=checkpoints&page=10", r'class="trial-row"'),
        ("/trials/1?all=1", r'class="ckpt-row"'),
        ("/checkpoints?page=1000", r'<td class="uuid">'),
        ("/models", r'href="/models/'),
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        assert 0 < len(re.findall(rows, response.text)) <= PAGE_SIZE, path
    for path in (f"/checkpoints/{uuid}", "/models/model-001", "/trials/1/live", "/trials/1/stamp"):
        assert client.get(path).status_code == 200, path
    assert "of 2200 (110000 rows)" in client.get("/checkpoints").text
    assert "of 2 (100 rows)" in client.get("/").text
    assert "of 18 (900 rows)" in client.get("/experiments/1").text


def test_sql_sort_and_filter_agree_with_python(scale):
    url, client = scale
    best = _validation_best(url, 1)
    html = client.get("/experiments/1", params={"sort": "best", "dir": "desc"}).text
    shown = [int(x) for x in re.findall(r'data-trial="(\d+)"', html)]
    expected = sorted(best, key=lambda t: (-best[t], t))[:PAGE_SIZE]
    assert [round(best[t], 9) for t in shown] == [round(best[t], 9) for t in expected]
    html = client.get("/experiments/1", params={"min": "1.0", "max": "1.5"}).text
    in_range = sorted(t for t, v in best.items() if 1.0 <= v <= 1.5)
    assert f"({len(in_range)} rows)" in html or len(in_range) <= PAGE_SIZE
    shown = [int(x) for x in re.findall(r'data-trial="(\d+)"', html)]
    assert shown == in_range[:PAGE_SIZE]
