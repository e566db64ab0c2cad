"""Fixtures of the UI tests: a small real registry + local storage with committed checkpoints,
and a Starlette TestClient over the app."""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright
from starlette.testclient import TestClient

from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings
from tests._helpers.ports import free_port
from tests.cli.helpers import Env, make_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]

#: (state, learning_rate, best val_loss) of the search's trials; the order of best values is
#: deliberately not the order of ids, so sorting is visible.
TRIALS = [
    ("COMPLETED", 0.1, 0.50),
    ("COMPLETED", 0.01, 0.20),
    ("ERROR", 0.3, 0.90),
    ("COMPLETED", 0.001, 0.35),
    ("ACTIVE", 0.05, 0.70),
]
CONFIG = {
    "name": "search",
    "searcher": {"name": "random", "metric": "val_loss", "smaller_is_better": True},
    "hyperparameters": {"learning_rate": {"type": "double", "minval": 0.001, "maxval": 0.3}},
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/x", "save_trial_latest": 1},
}


@dataclasses.dataclass
class UiEnv:
    env: Env
    experiment_id: int
    trial_ids: list[int]
    uuids: dict[int, list[str]]  # trial id -> its checkpoint UUIDs, oldest first

    def settings(self, **overrides: object) -> UiSettings:
        values = {
            "registry_url": self.env.registry_url,
            "storage_url": self.env.storage_url,
            "allowed_hosts": ("testserver",),
            **overrides,
        }
        return UiSettings(**values)  # type: ignore[arg-type]


def build_ui_env(path) -> UiEnv:
    """The small search of :data:`TRIALS` with 3 checkpoints per trial and one model."""
    env = make_env(path)
    uuids: dict[int, list[str]] = {}
    with env.registry() as registry:
        exp = registry.create_experiment("search", config=CONFIG)
        trial_ids = []
        for i, (state, lr, best) in enumerate(TRIALS):
            optimizer = "adam" if i % 2 == 0 else "sgd"
            trial = registry.create_trial(
                experiment_id=exp, hparams={"learning_rate": lr, "optimizer": optimizer}
            )
            trial_ids.append(trial)
            for i, steps in enumerate((10, 20, 30)):
                loss = best + 0.1 * (2 - i)
                registry.report_metrics(
                    trial, "training", steps, {"loss": loss * 0.9, "accuracy": 1 - loss}
                )
                registry.report_metrics(trial, "validation", steps, {"val_loss": loss})
            registry.set_trial_state(trial, state)
    for trial, (_state, _lr, best) in zip(trial_ids, TRIALS, strict=True):
        uuids[trial] = [
            env.save(trial, steps, experiment_id=exp, metrics={"val_loss": best + 0.1 * (2 - i)})
            for i, steps in enumerate((10, 20, 30))
        ]
    with env.registry() as registry:
        model = registry.create_model("mnist-cnn", labels=["vision"])
        model.register_version(uuids[trial_ids[1]][-1])
        model.register_version(uuids[trial_ids[3]][-1])
    return UiEnv(env, exp, trial_ids, uuids)


@pytest.fixture
def ui_env(tmp_path) -> UiEnv:
    return build_ui_env(tmp_path)


@pytest.fixture(scope="module")
def shared_ui_env(tmp_path_factory) -> UiEnv:
    """One env for a module's tests that change nothing in it."""
    return build_ui_env(tmp_path_factory.mktemp("ui-shared"))


@pytest.fixture
def client(ui_env: UiEnv) -> Iterator[TestClient]:
    with TestClient(create_app(ui_env.settings())) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"Chromium is missing at {CHROMIUM}; scripts/install_test_servers.sh installs it"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 760}, accept_downloads=True)
    opened = context.new_page()
    yield opened
    context.close()


class LiveServer:
    """uvicorn serving the UI on a free 127.0.0.1 port from a thread of this process."""

    def __init__(self, settings: UiSettings) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the UI server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def shots_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CKPTSTORE_UI_SCREENSHOTS") or tmp_path / "shots")
    if not folder.is_absolute():
        folder = REPO / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(page: Page, folder: Path, name: str, full_page: bool = False) -> None:
    """A screenshot named ``ui-<name>.png``, reduced to a 64-colour palette so the PNG stays
    small (the docs keep them under docs/images with CKPTSTORE_UI_SCREENSHOTS=docs/images)."""
    from PIL import Image

    path = folder / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=64).save(path, optimize=True)
    assert path.stat().st_size > 1000
