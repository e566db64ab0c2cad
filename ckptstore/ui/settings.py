"""What a UI server is pointed at and how it may be reached (no web imports here).

Example::

    from ckptstore.ui.settings import UiSettings, check_bind

    settings = UiSettings(registry_url="sqlite:///reg.db", storage_url="/tmp/ckpts")
    check_bind("127.0.0.1", settings.token)  # fine; "0.0.0.0" without a token raises
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
from typing import TYPE_CHECKING

from ckptstore import errors

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.storage_backends.spec import StorageConfig

#: Environment variable ``ckptstore ui`` reads the access token from (``--token`` wins).
TOKEN_ENV = "CKPTSTORE_UI_TOKEN"
#: Host names that only this machine can reach.
LOOPBACK_NAMES = ("localhost",)


@dataclasses.dataclass
class UiSettings:
    """A UI server's registry, storage and access rules.

    ``token``: every request must carry it (``Authorization: Bearer``, the cookie set by
    visiting ``/?token=...``, or ``?token=`` itself); None lets anyone who can reach the socket
    in, which :func:`check_bind` allows on loopback only. ``read_only`` refuses every write.
    ``csrf_secret`` is a fresh random value per server process, put in every form.
    ``storage`` is the storage as parsed where it entered (``ckptstore ui`` passes the
    ``StorageConfig`` of ``--storage``, so a JSON ``checkpoint_storage`` block's endpoint and
    credentials reach the UI); else it is parsed from ``storage_url`` (if empty:
    ``CKPTSTORE_STORAGE``, else the default folder, as for every verb).

    Example::

        UiSettings(registry_url="postgresql://me@db/ckpts", storage_url="s3://b/ckpts",
                   token="long-random-string", read_only=True)
    """

    registry_url: str
    storage_url: str = ""
    token: str | None = None
    read_only: bool = False
    #: ``--storage`` / ``CKPTSTORE_STORAGE`` named the storage: it wins over the URL a
    #: checkpoint's registry row recorded (the CLI's rule).
    explicit_storage: bool = False
    #: Extra host names the Host header may carry (the bind address is added by the server).
    allowed_hosts: tuple[str, ...] = ()
    csrf_secret: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(32))
    storage: StorageConfig | None = None

    def __post_init__(self) -> None:
        if self.storage is None:  # neither given: CKPTSTORE_STORAGE, else the default folder
            from ckptstore.storage_backends.spec import resolve

            self.storage = resolve(self.storage_url or None)
        self.storage_url = self.storage.url


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (InvalidConfig)."""
    if token is not None and len(token) < 16:
        raise errors.InvalidConfig(
            "The UI token is too short to keep anyone out; use at least 16 characters, e.g. "
            f"`python -c 'import secrets; print(secrets.token_urlsafe())'`. Received: "
            f"{len(token)} characters."
        )
    if not is_loopback(host) and not token:
        raise errors.InvalidConfig(
            f"Binding the UI to {host!r} exposes the registry beyond this machine; pass "
            f"--token (or set {TOKEN_ENV}) so every request must carry it, or bind 127.0.0.1 "
            f"and use an SSH tunnel. Received: --host {host} without a token."
        )
