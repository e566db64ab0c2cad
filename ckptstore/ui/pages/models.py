"""``/models`` and ``/models/{name}``: registered models, their versions, aliases, labels,
notes and metadata, and the UI's only writes (set or move an alias, add a label, add a note),
each one ordinary registry call after the CSRF check."""

from __future__ import annotations

from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ckptstore import errors
from ckptstore.reports.views import shown_metrics
from ckptstore.ui import queries
from ckptstore.ui.context import UiContext, safe_config
from ckptstore.ui.pages.params import int_param
from ckptstore.ui.security import checked_form, form_text

#: Alias moves shown on a model's page, newest first.
ALIAS_HISTORY_ROWS = 50


def models_list(ui: UiContext, request: Request) -> Response:
    page = queries.models_page(ui.registry, int_param(request, "page", 1))
    return ui.render(request, "models.html", page=page)


def model_page(ui: UiContext, request: Request, name: str) -> Response:
    model = ui.registry.get_model(name)
    versions = queries.model_versions_page(ui.registry, name, int_param(request, "page", 1))
    for row in versions.rows:
        row["shown_metrics"] = shown_metrics(row.get("checkpoint_metrics"))
    return ui.render(
        request,
        "model.html",
        model=model,
        metadata=safe_config(model.metadata),
        versions=versions,
        alias_history=safe_config(model.alias_history(limit=ALIAS_HISTORY_ROWS)),
    )


def _who(request: Request) -> str:
    """How an alias move made in the page is recorded: the UI and the browser's address."""
    host = request.client.host if request.client else "unknown"
    return f"ckptstore ui ({host})"


def _version(form_value: str) -> int:
    try:
        version = int(form_value)
    except ValueError:
        raise errors.InvalidConfig(
            f"The version must be a version number. Received: {form_value!r}"
        ) from None
    return version


async def model_action(ui: UiContext, request: Request, action: str) -> Response:
    form = await checked_form(request, ui.settings)
    name = form_text(form, "model", limit=256)

    def run() -> None:
        model = ui.registry.get_model(name)
        if action == "alias":
            model.set_alias(
                _version(form_text(form, "version")),
                form_text(form, "alias", limit=128),
                by=_who(request),
            )
        elif action == "label":
            model.add_labels(form_text(form, "label", limit=256))
        elif action == "note":
            version = model.get_version(_version(form_text(form, "version")))
            note = form_text(form, "note", limit=10_000)
            version.set_notes(f"{version.notes}\n{note}" if version.notes else note)
        else:
            raise errors.InvalidConfig(
                f"Unknown model action; use alias, label or note. Received: {action!r}"
            )

    await run_in_threadpool(run)
    return RedirectResponse(f"/models/{quote(name, safe='')}", status_code=303)
