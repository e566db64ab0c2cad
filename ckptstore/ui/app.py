"""The Starlette application: routes, error pages, static files and the guard around it all.

Example::

    from ckptstore.ui.app import create_app
    from ckptstore.ui.settings import UiSettings

    app = create_app(UiSettings(registry_url="sqlite:///reg.db", storage_url="/tmp/ckpts"))
    # uvicorn.run(app, host="127.0.0.1", port=8765)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from ckptstore import errors
from ckptstore.ui.context import UiContext
from ckptstore.ui.pages import checkpoints, experiments, models, runs, trials
from ckptstore.ui.security import GuardMiddleware, WriteRefused
from ckptstore.ui.settings import UiSettings

logger = logging.getLogger(__name__)

_STATIC = Path(__file__).parent / "static"


def _endpoint(handler: Callable[..., Any]) -> Callable[[Request], Any]:
    """A Starlette endpoint calling ``handler(ui, request, **path_params)``: sync handlers run
    in the thread pool (registry and storage calls block); ckptstore errors become error
    pages with their status."""
    is_async = inspect.iscoroutinefunction(handler)

    async def endpoint(request: Request) -> Response:
        ui: UiContext = request.app.state.ui
        try:
            if is_async:
                return await handler(ui, request, **request.path_params)
            return await run_in_threadpool(handler, ui, request, **request.path_params)
        except WriteRefused as exc:
            return PlainTextResponse(str(exc), status_code=403)
        except (errors.CkptstoreError, ValueError) as exc:
            return await run_in_threadpool(ui.error, request, exc)

    return endpoint


def routes() -> list[Any]:
    """Every route of the UI (the security tests walk this list)."""
    return [
        Route("/", _endpoint(runs.home)),
        Route("/experiments", _endpoint(experiments.experiments_list)),
        Route("/experiments/{experiment_id:int}", _endpoint(experiments.experiment_page)),
        Route("/trials/{trial_id:int}", _endpoint(trials.trial_page)),
        Route("/trials/{trial_id:int}/live", _endpoint(trials.trial_live)),
        Route("/trials/{trial_id:int}/stamp", _endpoint(trials.trial_stamp)),
        Route("/checkpoints", _endpoint(checkpoints.checkpoints_list)),
        Route("/checkpoints/{uuid}", _endpoint(checkpoints.checkpoint_page)),
        Route("/checkpoints/{uuid}/archive.tar", _endpoint(checkpoints.download)),
        Route("/checkpoints/{uuid}/verify", _endpoint(checkpoints.verify), methods=["POST"]),
        Route("/checkpoints/{uuid}/register", _endpoint(checkpoints.register), methods=["POST"]),
        Route("/models", _endpoint(models.models_list)),
        Route("/models/{name:path}", _endpoint(models.model_page)),
        Route("/model-actions/{action}", _endpoint(models.model_action), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(_STATIC)), name="static"),
    ]


def create_app(settings: UiSettings, *, bind_host: str = "127.0.0.1") -> ASGIApp:
    """The UI as an ASGI app (registry opened now; closed when the server shuts down)."""
    ui = UiContext(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        ui.close()

    app = Starlette(routes=routes(), lifespan=lifespan)
    app.state.ui = ui
    return GuardMiddleware(app, settings, bind_host=bind_host)
