"""``ckptstore ui``: serve the web UI over the registry and storage (``pip install
ckptstore[ui]``).

Example::

    $ ckptstore --registry sqlite:///reg.db --storage /tmp/ckpts ui --port 8765
    $ CKPTSTORE_UI_TOKEN=$(openssl rand -hex 24) ckptstore ui --host 0.0.0.0 --read-only
"""

from __future__ import annotations

import click

from ckptstore import errors
from ckptstore.cli.state import CliState, pass_state
from ckptstore.ui.settings import TOKEN_ENV, UiSettings, check_bind


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    help=f"Every request must carry this token (required off loopback). Env: {TOKEN_ENV}.",
)
@click.option("--read-only", is_flag=True, help="Refuse every write (aliases, labels, notes).")
@pass_state
def ui(state: CliState, host: str, port: int, token: str | None, read_only: bool) -> None:
    """Serve a web view of experiments, trials, checkpoints and models.

    Binds 127.0.0.1 by default; any other address needs --token. Open
    http://HOST:PORT/?token=TOKEN once to log a browser in.

    \b
    Example:
      ckptstore --registry sqlite:///reg.db ui --port 8765
    """
    check_bind(host, token or None)  # before importing the web stack: a bad bind is exit 2
    try:
        from ckptstore.ui.server import serve
    except ImportError as exc:  # starlette / uvicorn / jinja2 missing
        raise errors.MissingDependency(
            f"`ckptstore ui` needs the web extra: pip install 'ckptstore[ui]'. Received: {exc}"
        ) from None
    settings = UiSettings(
        registry_url=state.registry_url,
        storage=state.storage_config,
        token=token or None,
        read_only=read_only,
        explicit_storage=state.explicit_storage,
    )
    click.echo(f"ckptstore UI: http://{host}:{port}/ (Ctrl-C stops it)", err=True)
    serve(settings, host=host, port=port)
