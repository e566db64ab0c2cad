"""Render time of every page of ``ckptstore ui`` over a registry of 1,000 trials (plus 100 script
runs) and 110,000 checkpoints (target: < 300 ms each), against the static HTML reports of the
same objects.

The registry is built with bulk SQL inserts (``tests/ui/scale_registry.py``: 11 experiments,
one search of 900 trials, 100 checkpoints and 20 metric rows per trial, 20 models with 5
versions each). Each page is requested ``--repeats`` times through the app in-process
(Starlette's TestClient: routing, SQL, templates, the guard middleware; no network) after one
warm-up request; the median and the worst are printed. The peers measured in the same run are
``ckptstore trial report`` / ``ckptstore experiment report`` (``ckptstore.reports``), which
load whole trials and experiments in Python: the trial page is compared with the trial's report,
the experiment pages with the experiment's report.

    .venv/bin/python benchmarks/ui_pages.py
    .venv/bin/python benchmarks/ui_pages.py --postgres   # also on a throw-away PostgreSQL
    .venv/bin/python benchmarks/ui_pages.py --registry postgresql://user@127.0.0.1:5432/db
    .venv/bin/python benchmarks/ui_pages.py --trials 200 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from ckptstore.registry import Registry, schema  # noqa: E402
from ckptstore.reports.data import collect_experiment_report, collect_trial_report  # noqa: E402
from ckptstore.reports.html import render_report  # noqa: E402
from ckptstore.ui.app import create_app  # noqa: E402
from ckptstore.ui.settings import UiSettings  # noqa: E402
from tests.ui.scale_registry import build_scale_registry  # noqa: E402

TARGET_MS = 300.0


def _time(fn, repeats: int, cpu: list[float] | None = None) -> list[float]:
    """Wall milliseconds of each call (after a warm-up); with ``cpu``, also this process's CPU
    milliseconds per call (all threads: the app, SQLite, the test client), which a busy machine
    disturbs far less than wall time."""
    fn()  # warm-up: templates compiled, connections open
    out = []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - start) * 1000)
        if cpu is not None:
            cpu.append((time.process_time() - start_cpu) * 1000)
    return out


def _pages(registry_url: str) -> dict[str, str]:
    with Registry(registry_url) as registry:

        def one(query):
            return registry.read(lambda c: c.execute(query).scalar(), what="pick a row")

        big = one(sa.select(schema.trials.c.experiment_id).where(schema.trials.c.id == 1))
        small = one(sa.select(sa.func.max(schema.experiments.c.id)))
        trial = one(
            sa.select(sa.func.min(schema.trials.c.id)).where(schema.trials.c.experiment_id == big)
        )
        uuid = one(
            sa.select(schema.checkpoints.c.uuid)
            .where(
                schema.checkpoints.c.trial_id == trial, schema.checkpoints.c.state == "COMMITTED"
            )
            .limit(1)
        )
        model = one(sa.select(sa.func.min(schema.models.c.name)))
    return {
        "experiments list": "/experiments",
        f"experiment {big} (900 trials)": f"/experiments/{big}",
        f"experiment {big} sorted by best, filtered": f"/experiments/{big}?sort=best&dir=desc&state=COMPLETED&min=0.5&max=2",
        f"experiment {big} page 10 by checkpoints": f"/experiments/{big}?sort=checkpoints&page=10",
        f"experiment {small} (10 trials)": f"/experiments/{small}",
        f"trial {trial}": f"/trials/{trial}",
        f"trial {trial}, all 100 checkpoints, log + smoothing": f"/trials/{trial}?all=1&log=1&smooth=0.6",
        f"trial {trial} live fragment": f"/trials/{trial}/live",
        f"trial {trial} stamp (polled)": f"/trials/{trial}/stamp",
        "runs (/: 100 script runs, newest experiments)": "/",
        f"experiment {big} comparing 3 trials": f"/experiments/{big}?compare={trial}&compare={trial + 1}&compare={trial + 2}",
        "checkpoints list": "/checkpoints",
        "checkpoints list page 1000": "/checkpoints?page=1000",
        "checkpoints COMMITTED page 20": "/checkpoints?state=COMMITTED&page=20",
        "checkpoint": f"/checkpoints/{uuid}",
        "models list": "/models",
        "model": f"/models/{model}",
        "_trial_id": str(trial),
        "_big": str(big),
        "_small": str(small),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", help="an empty registry to fill (default: a temp SQLite)")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--checkpoints-per-trial", type=int, default=100)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="run again on a PostgreSQL server started here (tests/servers/postgres_fixtures.py)",
    )
    parser.add_argument("--script-runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="ckptstore-ui-bench-")
    out = {
        "sqlite" if not args.registry else "given": run(
            args, tmp, args.registry or f"sqlite:///{tmp}/registry.db"
        )
    }
    if args.postgres:
        from tests.servers.postgres_fixtures import _start_server, _stop_server

        base = tempfile.mkdtemp(prefix="ckptstore-ui-bench-pg-")
        server = _start_server(base)
        try:
            out["postgresql"] = run(args, tmp, server.create_database())
        finally:
            _stop_server(server)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def run(args: argparse.Namespace, tmp: str, url: str) -> dict:
    """Build the registry at ``url``, time every page and the peers; returns the figures."""
    start = time.perf_counter()
    counts = build_scale_registry(
        url,
        trials=args.trials,
        checkpoints_per_trial=args.checkpoints_per_trial,
        script_runs=args.script_runs,
    )
    print(
        f"\n== {url.split('://')[0]} ==\nbuilt {counts} in {time.perf_counter() - start:.1f} s ({url.split('://')[0]})"
    )
    pages = _pages(url)
    trial_id, big, small = (
        int(pages.pop("_trial_id")),
        int(pages.pop("_big")),
        int(pages.pop("_small")),
    )
    settings = UiSettings(registry_url=url, storage_url=tmp, allowed_hosts=("testserver",))
    results = {}
    with TestClient(create_app(settings)) as client:
        print(f"\n{'page':58} {'median ms':>10} {'max ms':>8} {'CPU ms':>7}  bytes")
        for name, path in pages.items():
            sizes = []

            def get(path=path, sizes=sizes):
                response = client.get(path)
                assert response.status_code == 200, (path, response.status_code)
                sizes.append(len(response.content))

            cpu: list[float] = []
            times = _time(get, args.repeats, cpu)
            median = statistics.median(times)
            results[name] = {
                "path": path,
                "median_ms": median,
                "max_ms": max(times),
                "cpu_ms": statistics.median(cpu),
            }
            flag = "" if median < TARGET_MS else "  OVER TARGET"
            print(
                f"{name:58} {median:10.1f} {max(times):8.1f} {statistics.median(cpu):7.1f}"
                f"  {sizes[-1]}{flag}"
            )

        # The experiment page's charts are cached per metrics stamp: a first view (or the view
        # after new metrics) draws them. Measured here with the cache emptied before each call.
        ui = client.app.app.state.ui  # GuardMiddleware -> Starlette
        path = f"/experiments/{big}"

        def first_view() -> None:
            ui._cache.clear()
            assert client.get(path).status_code == 200

        cpu = []
        times = _time(first_view, args.repeats, cpu)
        name = f"experiment {big} first view (charts drawn, not cached)"
        results[name] = {
            "path": path,
            "median_ms": statistics.median(times),
            "max_ms": max(times),
            "cpu_ms": statistics.median(cpu),
        }
        print(
            f"{name:58} {statistics.median(times):10.1f} {max(times):8.1f} "
            f"{statistics.median(cpu):7.1f}"
        )

    print("\npeers in the same run (static HTML reports, ckptstore.reports):")
    with Registry(url) as registry:
        peers = {
            "trial report": (
                lambda: render_report(collect_trial_report(registry, trial_id)),
                f"trial {trial_id}",
            ),
            f"experiment report ({small}, 10 trials)": (
                lambda: render_report(collect_experiment_report(registry, small)),
                f"experiment {small} (10 trials)",
            ),
            f"experiment report ({big}, 900 trials)": (
                lambda: render_report(collect_experiment_report(registry, big)),
                f"experiment {big} (900 trials)",
            ),
        }
        for name, (fn, page) in peers.items():
            times = _time(fn, 1 if "900" in name else args.repeats)
            median = statistics.median(times)
            ratio = median / results[page]["median_ms"]
            results[name] = {"median_ms": median, "ui_page": page, "report_over_page": ratio}
            print(f"{name:58} {median:10.1f} ms  = {ratio:.1f}x the UI page '{page}'")
    return {"counts": counts, "results": results}


if __name__ == "__main__":
    main()
