"""``/checkpoints`` and ``/checkpoints/{uuid}``: the list, one checkpoint's metadata and
manifest, verify, download as one archive, and register as a model version.

A UUID from the URL reaches storage only after :func:`ckptstore.checkpointing.format.
check_storage_id` accepted it (400 otherwise) and the registry knew it (404 otherwise); the
storage is the one the registry row names, and every key the manifest lists passes the same
checks a download does.
"""

from __future__ import annotations

import tempfile
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from ckptstore import errors
from ckptstore.checkpointing import format as ckpt_format
from ckptstore.checkpointing import restore
from ckptstore.registry import Checkpoint
from ckptstore.reports.views import shown_metrics
from ckptstore.ui import queries
from ckptstore.ui.archive import checkpoint_tar
from ckptstore.ui.context import UiContext, safe_config, safe_url
from ckptstore.ui.pages.params import CHECKPOINT_STATES, choice_param, int_param
from ckptstore.ui.security import checked_form, form_text
from ckptstore.ui.sharing import shared_with
from ckptstore.ui.signature import signature_status

LIVE = ("COMMITTED", "PARTIALLY_DELETED")


def find(ui: UiContext, uuid: str) -> Checkpoint:
    """The registry row of a UUID from a URL (InvalidConfig -> 400 for a malformed one)."""
    ckpt_format.check_storage_id(uuid)
    return ui.registry.get_checkpoint(uuid)


def _manifest(ui: UiContext, ckpt: Checkpoint) -> ckpt_format.Manifest:
    if ckpt.state not in LIVE:
        raise errors.CheckpointNotFound(
            f"Checkpoint {ckpt.uuid} is {ckpt.state}; only committed checkpoints have files to "
            "show, verify or download."
        )
    return ckpt_format.load_manifest(ui.storage_for(ckpt), ckpt.uuid)


def checkpoints_list(ui: UiContext, request: Request) -> Response:
    state = choice_param(request, "state", CHECKPOINT_STATES)
    trial = request.query_params.get("trial")
    trial_id = int_param(request, "trial", 0) if trial else None
    page = queries.checkpoints_page(ui.registry, int_param(request, "page", 1), state, trial_id)
    return ui.render(request, "checkpoints.html", page=page, state=state, states=CHECKPOINT_STATES)


def checkpoint_page(
    ui: UiContext, request: Request, uuid: str, verified: dict[str, Any] | None = None
) -> Response:
    ckpt = find(ui, uuid)
    manifest, manifest_error = None, None
    if ckpt.state in LIVE:
        try:
            manifest = _manifest(ui, ckpt)
        except errors.CkptstoreError as exc:
            manifest_error = str(exc)
    models = [m.name for m in ui.registry.list_models()]
    return ui.render(
        request,
        "checkpoint.html",
        ckpt=ckpt,
        lineage=_lineage(ui, ckpt, manifest),
        signature=signature_status(ui.storage_for(ckpt), uuid, manifest) if manifest else None,
        storage=safe_url(ckpt.storage_url),
        metadata=safe_config(ckpt.metadata),
        metrics=shown_metrics(ckpt.metrics),
        manifest=manifest,
        manifest_error=manifest_error,
        versions=queries.versions_of(ui.registry, [uuid]).get(uuid, []),
        models=models,
        verified=verified,
    )


def _lineage(
    ui: UiContext, ckpt: Checkpoint, manifest: ckpt_format.Manifest | None
) -> dict[str, Any]:
    """The checkpoint this run resumed from (metadata ``resumed_from``, linked only when it is
    a well-formed UUID), the trial's previous checkpoint and the bytes shared with it."""
    resumed_from = (ckpt.metadata or {}).get("resumed_from")
    try:
        ckpt_format.check_storage_id(resumed_from)
    except (errors.CkptstoreError, TypeError):
        resumed_from = None
    previous, sharing = None, None
    if ckpt.trial_id is not None:
        previous = queries.previous_checkpoint(
            ui.registry, ckpt.trial_id, ckpt.steps_completed, ckpt.uuid
        )
    if previous is not None and manifest is not None:
        try:
            before = _manifest(ui, ui.registry.get_checkpoint(previous))
            sharing = shared_with(manifest, before)
        except errors.CkptstoreError as exc:  # the previous one is damaged: say so, go on
            sharing = str(exc)
    return {"resumed_from": resumed_from, "previous": previous, "sharing": sharing}


async def verify(ui: UiContext, request: Request, uuid: str) -> Response:
    """Download every file into a temporary folder and check it against the manifest (not a
    write: allowed in read-only mode, but a POST with the CSRF token, as it costs a download)."""
    await checked_form(request, ui.settings, write=False)
    ckpt = find(ui, uuid)

    def run() -> dict[str, Any]:
        manifest = _manifest(ui, ckpt)
        with tempfile.TemporaryDirectory(prefix="ckptstore-ui-verify-") as tmp:
            try:
                # Checks what storage holds, so nothing comes from the local restore cache.
                checked = restore.download_checkpoint(
                    ui.storage_for(ckpt), uuid, manifest, tmp, cache=False
                ).files
            except errors.ChecksumMismatch as exc:
                return {"ok": False, "message": str(exc)}
        return {
            "ok": True,
            "message": f"{len(checked)} files, {sum(checked.values())} bytes match the manifest.",
        }

    result = await run_in_threadpool(run)
    return await run_in_threadpool(checkpoint_page, ui, request, uuid, result)


def download(ui: UiContext, request: Request, uuid: str) -> Response:
    ckpt = find(ui, uuid)
    manifest = _manifest(ui, ckpt)
    storage = ui.storage_for(ckpt)
    return StreamingResponse(
        checkpoint_tar(storage, uuid, manifest),
        media_type="application/x-tar",
        headers={"content-disposition": f'attachment; filename="{uuid}.tar"'},
    )


async def register(ui: UiContext, request: Request, uuid: str) -> Response:
    form = await checked_form(request, ui.settings)
    name = form_text(form, "model", limit=256)
    find(ui, uuid)

    def run() -> int:
        try:
            model = ui.registry.get_model(name)
        except errors.ModelNotFound:
            model = ui.registry.create_model(name)
        return model.register_version(uuid).version

    await run_in_threadpool(run)
    return RedirectResponse(f"/models/{quote(name, safe='')}", status_code=303)
