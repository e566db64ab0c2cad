"""Every code example in the documentation runs (conventions: tests/docs/examples.py).

A renamed function, command or option breaks a page's example here, not the reader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests._helpers.child_runs import waits_beside
from tests._helpers.jax_env import jax_missing, repo_pythonpath
from tests.docs.examples import ROOT, Block, blocks_of, pages, unrunnable_bash
from tests.servers.emulators import create_bucket

#: The emulator fixture each URL scheme in a runnable example needs.
SERVERS = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}
_BUCKET = re.compile(r"\b(s3|gs|az)://([a-z0-9][a-z0-9.-]+)")
#: ``os.environ["KERAS_BACKEND"] = "jax"`` or ``KERAS_BACKEND=jax``: the page runs Keras on JAX.
_ON_JAX = re.compile(r"""KERAS_BACKEND["'\]]*\s*=\s*["']?jax\b""")


#: What no page's run may print (session 14's first hour: each was seen, and fixed).
NOISE = {
    "every None": "a None where a number belongs (TFKerasTrial's first log line)",
    "GeneratorDataset iterator": "TensorFlow's finalizing error at the exit of a cut fit()",
    "INFO:ckptstore": "ckptstore's lines twice (a root handler absl's logging added)",
}
#: A warning line of the ``ckptstore`` command (``WARNING ckptstore.module: message``).
_CLI_WARNING = re.compile(r"^WARNING ckptstore[\w.]*: .*$", re.M)


def noise_in(output: str) -> list[str]:
    """What of :data:`NOISE` ``output`` holds, and any ``ckptstore`` command warning it repeats
    (``gc`` said the same one once per trial of the store)."""
    found = [f"{marker!r}: {why}" for marker, why in NOISE.items() if marker in output]
    lines = _CLI_WARNING.findall(output)
    found += sorted({f"repeated: {line}" for line in lines if lines.count(line) > 1})
    return found


def _runnable(path: Path) -> list[Block]:
    return [b for b in blocks_of(path) if b.kind in ("python", "bash", "file")]


def _buckets(path: Path) -> set[tuple[str, str]]:
    return {m.groups() for b in _runnable(path) for m in _BUCKET.finditer(b.code)}


def _needs_postgres(path: Path) -> bool:
    return any("DATABASE_URL" in b.code for b in _runnable(path))


def _on_jax(path: Path) -> bool:
    return any(_ON_JAX.search(b.code) for b in _runnable(path))


def _params() -> list[object]:
    """Every page with runnable examples: the in-order pages first, in their order (each test
    then waits only for its own page of the chain), then the others."""
    params = []
    chain = [p for p in in_order() if p in set(pages())]
    for path in chain + [p for p in pages() if p not in chain]:
        if not any(b.kind in ("python", "bash") for b in blocks_of(path)):
            continue
        marks = [pytest.mark.servers] if _buckets(path) or _needs_postgres(path) else []
        params.append(pytest.param(path, marks=marks, id=str(path.relative_to(ROOT / "docs"))))
    return params


def test_every_tutorial_and_how_to_is_in_the_in_order_run() -> None:
    """Every tutorial and how-to page is in the navigation, so the in-order run covers it."""
    listed = set(in_order())
    assert listed and listed == {p for p in pages() if p.parent.name in ("tutorials", "how-to")}, (
        listed
    )


def test_every_example_runs_or_says_why() -> None:
    """A bash block calling something the test cannot run must carry ``# not run: <why>``."""
    kinds: dict[str, int] = {}
    unmarked = []
    for path in pages():
        for block in blocks_of(path):
            kinds[block.kind] = kinds.get(block.kind, 0) + 1
            if block.kind == "bash" and unrunnable_bash(block):
                unmarked.append(f"{block.page}:{block.line}: {unrunnable_bash(block)}")
            if block.kind == "not-run":
                assert block.not_run_reason, f"{block.page}:{block.line}: say why it is not run"
    assert not unmarked, "mark these '# not run: <why>' or make them runnable:\n" + "\n".join(
        unmarked
    )
    print(f"docs examples: {kinds}")
    assert kinds.get("python", 0) + kinds.get("bash", 0) >= 20, kinds


def test_every_bucket_a_page_uses_is_one_the_reader_was_told_to_create() -> None:
    """CI creates the buckets the examples name; a reader creates those a page told them to
    (the S3 tutorial's ``create_bucket``). The cache and signing pages used buckets no page
    had them create: their first block failed with ``Bucket s3://cache-demo does not exist``."""
    told: set[str] = set()
    untold = []
    # Pages about a backend itself, written for the reader's own buckets and accounts (and a
    # team bucket named in a comment): not followed as a newcomer's walk on one emulator.
    own_accounts = {"storage.md", "postgres.md"}
    for path in [p for p in in_order() if p.name not in own_accounts]:
        told |= set(
            re.findall(r"create_bucket\(Bucket=['\"]([a-z0-9.-]+)['\"]\)", path.read_text())
        )
        untold += [f"{path.name}: {s}://{b}" for s, b in sorted(_buckets(path)) if b not in told]
    assert not untold, untold


def in_order() -> list[Path]:
    """The tutorials, then the how-to pages, in the site's navigation order: the order a
    newcomer follows them (mkdocs.yml ``nav``)."""
    nav = re.findall(r"^\s+- [^\n]*?:\s*((?:tutorials|how-to)/[\w.-]+\.md)\s*$", _MKDOCS, re.M)
    return [ROOT / "docs" / rel for rel in nav]


_MKDOCS = (ROOT / "mkdocs.yml").read_text()


def _run_page(
    page: Path, tmp: Path, extra_env: dict[str, str], environ: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """One page's examples in ``tmp/work`` with CKPTSTORE_HOME ``tmp/home`` (fresh, or the
    ones the pages before it in :func:`in_order` used), and the suite's JAX on PYTHONPATH for a
    page on JAX (tests/_helpers/jax_env.py). ``environ``: the session's environment when the
    runs started (other tests change ``os.environ`` while the pages run)."""
    work = tmp / "work"
    if not work.exists():
        work.mkdir(parents=True)
        (work / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in environ.items() if not k.startswith("CKPTSTORE_")}
    env.update(
        CKPTSTORE_HOME=str(tmp / "home"),
        PYTHONPATH=os.pathsep.join(
            [repo_pythonpath("jax" if _on_jax(page) else None), env.get("PYTHONPATH", "")]
        ),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONUNBUFFERED="1",
        **extra_env,
    )
    return subprocess.run(
        [sys.executable, "-m", "tests.docs.run_page", str(page.relative_to(ROOT / "docs"))],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


#: The runs of the selected pages, once started (by :func:`start_page_runs`).
_STARTED: dict[Path, Future[subprocess.CompletedProcess[str]]] | None = None


def start_page_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, Future[subprocess.CompletedProcess[str]]]:
    """Starts the selected pages' runs, two at a time: most of a page's time is one process
    importing TensorFlow, so a second page uses the other core instead of waiting. One worker
    runs the tutorials and how-to pages in order in one store, the other the rest. Called by
    ``tests/conftest.py`` as the session starts, so the pages run beside the other tests (the
    page tests only check the results); the runs stop at the end of the session."""
    global _STARTED
    if _STARTED is not None:
        return _STARTED
    selected = [
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_page_examples_run"
    ]
    for scheme, bucket in sorted(set().union(*(_buckets(p) for p in selected))):
        create_bucket(request.getfixturevalue(SERVERS[scheme]), bucket)
    extra_env = {page: {} for page in selected}
    for page in filter(_needs_postgres, selected):
        server = request.getfixturevalue("postgres_server")
        extra_env[page]["DATABASE_URL"] = server.create_database()
    environ = dict(os.environ)
    # The tutorials and how-to pages run one after another in ONE store and folder, as a
    # newcomer follows them (issue 39: pages that collided there passed one by one); the
    # other pages run beside them, each in a fresh store.
    pool = ThreadPoolExecutor(max_workers=2)
    stopping = threading.Event()
    chain = [page for page in in_order() if page in extra_env]
    shared = tmp_path_factory.mktemp("docs-in-order")

    chained: dict[Path, Future[subprocess.CompletedProcess[str]]] = {p: Future() for p in chain}

    def run_chain() -> None:
        for page in chain:
            if stopping.is_set():  # the session ended early (-x): no page starts after that
                chained[page].cancel()
                continue
            try:
                chained[page].set_result(_run_page(page, shared, extra_env[page], environ))
            except BaseException as exc:  # noqa: BLE001 - that page's test reports it
                chained[page].set_exception(exc)

    pool.submit(run_chain)
    runs = {
        page: pool.submit(
            _run_page, page, tmp_path_factory.mktemp("docs-page"), extra_env[page], environ
        )
        for page in selected
        if page not in chain
    }
    runs.update(chained)

    def stop() -> None:  # before the servers' teardown: they were set up after this request
        stopping.set()
        pool.shutdown(wait=True, cancel_futures=True)

    request.addfinalizer(stop)
    _STARTED = runs
    return runs


@pytest.fixture(scope="session")
def page_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, Future[subprocess.CompletedProcess[str]]]:
    """The selected pages' runs (:func:`start_page_runs`), started already or now."""
    return start_page_runs(request, tmp_path_factory)


@pytest.mark.e2e
@pytest.mark.parametrize("page", _params())
@waits_beside  # its page ran beside the other tests: checked last, when it is likely done
def test_page_examples_run(page: Path, page_runs) -> None:
    if _on_jax(page) and jax_missing():
        pytest.skip(jax_missing())  # with CI=true the skip fails (tests/_helpers/ci_skips.py)
    done = page_runs[page].result()
    output = done.stdout + done.stderr
    print(done.stdout[-3000:])  # what the page printed (pytest -rP shows it)
    assert done.returncode == 0, output[-6000:]
    expected = sum(b.kind in ("python", "bash") for b in blocks_of(page))
    assert f"ran {expected}" in done.stdout, output[-3000:]
    assert not noise_in(output), noise_in(output)
