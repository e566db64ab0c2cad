"""Run the UI with uvicorn (what ``ckptstore ui`` calls).

Example::

    from ckptstore.ui.server import serve
    from ckptstore.ui.settings import UiSettings

    serve(UiSettings(registry_url="sqlite:///reg.db", storage_url="/tmp/ckpts"), port=8765)
"""

from __future__ import annotations

import logging

import uvicorn

from ckptstore.ui.app import create_app
from ckptstore.ui.settings import UiSettings, check_bind

logger = logging.getLogger(__name__)


def serve(settings: UiSettings, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Check the bind rules, then serve until interrupted (Ctrl-C / SIGTERM)."""
    check_bind(host, settings.token)
    app = create_app(settings, bind_host=host)
    logger.info("ckptstore UI on http://%s:%d (read-only: %s)", host, port, settings.read_only)
    uvicorn.run(
        app, host=host, port=port, log_level="warning", access_log=False, proxy_headers=False
    )
