"""Who may reach the UI and which POSTs it accepts.

- :class:`GuardMiddleware` (outermost): with a token, every request must carry it (bearer
  header, the ``ckptstore_ui_token`` cookie, or ``?token=`` once, which sets the cookie and
  redirects to the same URL without it); without one, the Host header must name this machine
  (a page on another site cannot reach the server through DNS rebinding). Every response gets
  headers that forbid framing, sniffing, referrers, caching and scripts from elsewhere.
- :func:`checked_form`: a write must be a POST from this site whose form carries the server's
  CSRF token; ``read_only`` refuses it.

Example::

    app = GuardMiddleware(starlette_app, settings, bind_host="127.0.0.1")
"""

from __future__ import annotations

import hmac
import logging
from urllib.parse import urlencode

from starlette.datastructures import FormData, Headers, MutableHeaders, QueryParams
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ckptstore.ui.settings import LOOPBACK_NAMES, UiSettings

logger = logging.getLogger(__name__)

TOKEN_COOKIE = "ckptstore_ui_token"
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class WriteRefused(Exception):
    """A POST that is not allowed (read-only server, missing or wrong CSRF token)."""


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _host_name(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8765
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _local_path(path: str) -> str:
    """``path`` as a same-origin path: browsers read a leading ``//`` or ``/\\`` as another host
    (``//evil.example/x``), so the run of slashes and backslashes becomes one ``/``."""
    return "/" + path.lstrip("/\\")


class GuardMiddleware:
    """Token / Host checks and security headers around the whole app (pure ASGI, so streamed
    downloads pass through untouched)."""

    def __init__(self, app: ASGIApp, settings: UiSettings, bind_host: str = "127.0.0.1") -> None:
        self.app = app
        self.token = settings.token
        self.hosts = {
            *LOOPBACK_NAMES,
            "127.0.0.1",
            "::1",
            bind_host.lower().strip("[]"),
            *(h.lower() for h in settings.allowed_hosts),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the UI has none: refuse rather than pass unchecked
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, self._with_headers(send))
            return
        await self.app(scope, receive, self._with_headers(send))

    def _refusal(self, scope: Scope) -> ASGIApp | None:
        headers = Headers(scope=scope)
        if self.token is None:
            if _host_name(headers.get("host", "")) not in self.hosts:
                return PlainTextResponse("Unknown Host header.", status_code=400)
            return None
        query = QueryParams(scope.get("query_string", b"").decode("latin-1"))
        auth = headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        cookie = Request(scope).cookies.get(TOKEN_COOKIE)
        if _same(bearer, self.token) or _same(cookie, self.token):
            return None
        if _same(query.get("token"), self.token):
            rest = urlencode([(k, v) for k, v in query.multi_items() if k != "token"])
            response = RedirectResponse(
                _local_path(scope["path"]) + (f"?{rest}" if rest else ""), 303
            )
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
            return response
        return PlainTextResponse(
            "This ckptstore UI needs its access token: open it as /?token=TOKEN once, or send "
            "'Authorization: Bearer TOKEN'.",
            status_code=401,
            headers={"www-authenticate": "Bearer"},
        )

    @staticmethod
    def _with_headers(send: Send) -> Send:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        return send_with_headers


async def checked_form(request: Request, settings: UiSettings, *, write: bool = True) -> FormData:
    """The form of a POST, after the same-site and CSRF checks and, for a write, the read-only
    check (:class:`WriteRefused` otherwise)."""
    if write and settings.read_only:
        raise WriteRefused("This UI was started with --read-only; it makes no changes.")
    site = request.headers.get("sec-fetch-site")
    if site not in (None, "same-origin", "none"):
        raise WriteRefused(f"Refused a write sent from another site (Sec-Fetch-Site: {site}).")
    origin = request.headers.get("origin")
    if origin not in (None, "null") and _host_name(origin.split("://", 1)[-1]) != _host_name(
        request.headers.get("host", "")
    ):
        raise WriteRefused("Refused a write whose Origin is another site.")
    form = await request.form()
    token = form.get("csrf")
    if not isinstance(token, str) or not _same(token, settings.csrf_secret):
        raise WriteRefused(
            "The form's CSRF token is missing or stale (the server was restarted?); reload the "
            "page and submit again."
        )
    return form


def form_text(form: FormData, name: str, *, limit: int = 1000) -> str:
    """A required text field of a form, stripped (ValueError naming it if missing)."""
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"The form field {name!r} is required.")
    if len(value) > limit:
        raise ValueError(f"The form field {name!r} is longer than {limit} characters.")
    return value.strip()


__all__ = ["GuardMiddleware", "WriteRefused", "checked_form", "form_text"]
