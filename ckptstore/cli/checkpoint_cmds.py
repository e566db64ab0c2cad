"""``ckptstore checkpoint ...``: list, describe, download, verify, delete and export checkpoints.

Example::

    $ ckptstore checkpoint list --trial 3 --json
    $ ckptstore checkpoint download 0b7c... -o ./ckpt --selector '*.keras'
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Any

import click

from ckptstore import defaults, errors
from ckptstore.checkpointing.index import LIVE_STATES, STATES
from ckptstore.cli.download import download_checkpoint, download_options
from ckptstore.cli.output import emit_json, emit_record, emit_rows, human_size, json_option
from ckptstore.cli.state import CliState, pass_state
from ckptstore.reports.views import checkpoint_detail, checkpoint_view, model_versions_by_checkpoint

logger = logging.getLogger(__name__)

LIST_COLUMNS = (
    ("uuid", "UUID"),
    ("trial_id", "Trial"),
    ("experiment_id", "Exp"),
    ("steps_completed", "Steps"),
    ("state", "State"),
    ("metrics", "Metrics"),
    ("storage_url", "Storage"),
    ("created_at", "Created"),
)
ALL_STATES = STATES


def find_checkpoint(state: CliState, uuid: str) -> Any:
    """The registry row of ``uuid``; CheckpointNotFound naming both places looked at."""
    try:
        return state.registry().get_checkpoint(uuid)
    except errors.CheckpointNotFound:
        raise errors.CheckpointNotFound(
            f"No checkpoint {uuid!r} in the registry {_safe(state)}. Check the UUID with "
            "`ckptstore checkpoint list`, or run `ckptstore reindex` if the registry is out of "
            "date with the storage."
        ) from None


def full_uuid(state: CliState, uuid: str) -> str:
    """The whole UUID a unique prefix (8+ characters) names in the registry; ``uuid`` itself
    when the registry has no such row (a storage-only checkpoint is looked up as given)."""
    try:
        return state.registry().get_checkpoint(uuid).uuid
    except errors.CheckpointNotFound:
        return uuid


def _safe(state: CliState) -> str:
    registry = state._registry
    return repr(registry) if registry is not None else "(not opened)"


@click.group()
def checkpoint() -> None:
    """List, describe, download, verify, delete and export checkpoints.

    \b
    Example:
      ckptstore checkpoint list --trial 3
      ckptstore checkpoint download 0b7c... -o ./ckpt
    """


@checkpoint.command("list")
@click.option("--trial", "trial_id", type=int, help="Only this trial's checkpoints.")
@click.option("--experiment", "experiment_id", type=int, help="Only this experiment's checkpoints.")
@click.option("--all", "include_all", is_flag=True, help="Include PENDING and DELETED checkpoints.")
@json_option
@pass_state
def list_cmd(
    state: CliState,
    trial_id: int | None,
    experiment_id: int | None,
    include_all: bool,
    as_json: bool,
) -> None:
    """List checkpoints trial by trial, each trial's by steps completed, then age, with the
    storage each is in. With --storage (or CKPTSTORE_STORAGE), only the checkpoints in that
    storage (or below it). With --all, a PENDING checkpoint whose upload was abandoned (older
    than GC's grace period) says so; `ckptstore gc` cleans it.

    \b
    Example:
      ckptstore checkpoint list --experiment 1 --json
      ckptstore --storage s3://bucket/ckpts checkpoint list
    """
    registry = state.registry()
    if trial_id is not None:
        registry.get_trial(trial_id)  # TrialNotFound -> exit 3
    if experiment_id is not None:
        registry.get_experiment(experiment_id)
    rows = registry.list_checkpoints(
        trial_id=trial_id,
        experiment_id=experiment_id,
        states=ALL_STATES if include_all else LIVE_STATES,
    )
    if state.explicit_storage:
        from ckptstore.checkpointing.row_storage import is_under

        # A row without a URL predates recording it: it belongs to whatever storage is asked.
        rows = [c for c in rows if not c.storage_url or is_under(c.storage_url, state.storage_url)]
    # Trial by trial (the registry lists by steps: several trials' rows were interleaved).
    rows.sort(key=lambda c: (c.trial_id is None, c.trial_id or 0))
    emit_rows([_marked(checkpoint_view(c), as_json) for c in rows], LIST_COLUMNS, as_json)


def _marked(view: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """A PENDING row older than GC's grace period is an abandoned upload (its process died):
    said so (``abandoned`` in JSON, in the State column of the table); `ckptstore gc` cleans
    it."""
    import datetime as dt

    from ckptstore.checkpointing.collector import DEFAULT_GRACE_SECONDS

    created = view.get("created_at")
    if view.get("state") != "PENDING" or not isinstance(created, dt.datetime):
        return view
    age = dt.datetime.now(dt.timezone.utc) - created.astimezone(dt.timezone.utc)
    abandoned = age.total_seconds() > DEFAULT_GRACE_SECONDS
    if as_json:
        return {**view, "abandoned": abandoned}
    return {**view, "state": "PENDING (abandoned: gc cleans it)"} if abandoned else view


@checkpoint.command("describe")
@click.argument("uuid")
@json_option
@pass_state
def describe_cmd(state: CliState, uuid: str, as_json: bool) -> None:
    """Show one checkpoint: trial, steps, state, metrics, metadata and files.

    \b
    Example:
      ckptstore checkpoint describe 0b7c4e1e-...
    """
    view = checkpoint_detail(find_checkpoint(state, uuid))
    view["model_versions"] = model_versions_by_checkpoint(state.registry()).get(uuid, [])
    if as_json:
        emit_json(view)
        return
    resources = view.pop("resources")
    view["size"] = human_size(view.pop("size_bytes"))
    emit_record(view, False, title=f"Checkpoint {uuid}")
    click.echo("files:")
    for rel, size in sorted(resources.items()):
        click.echo(f"  {rel}  ({human_size(size)})")


@checkpoint.command("download")
@click.argument("uuid")
@download_options("./UUID")
@json_option
@pass_state
def download_cmd(
    state: CliState,
    uuid: str,
    out_dir: str | None,
    selectors: tuple[str, ...],
    no_cache: bool,
    as_json: bool,
) -> None:
    """Download a checkpoint and verify every file's size and crc32c. Bytes the local restore
    cache holds are taken from it (verified); --json says how many came from where.

    \b
    Example:
      ckptstore checkpoint download 0b7c... -o ./ckpt --selector 'model.keras'
    """
    uuid = full_uuid(state, uuid)
    out_dir = out_dir or os.path.join(os.getcwd(), uuid)
    from ckptstore.checkpointing import signing

    report = download_checkpoint(
        state,
        uuid,
        out_dir,
        list(selectors) or None,
        cache=False if no_cache else None,
        verify_key=signing.verify_key(),
    )
    if as_json:
        emit_json({"uuid": uuid, "output": out_dir, **report.as_dict()})
        return
    total = sum(report.files.values())
    click.echo(
        f"Downloaded {len(report.files)} files ({human_size(total)}) of {uuid} to {out_dir}"
        f" ({human_size(report.from_storage)} from storage, "
        f"{human_size(report.from_cache)} from the restore cache)"
    )


_KEY_HELP = "PEM file of the {what} EC key (default: ${env})."


@checkpoint.command("verify")
@click.argument("uuid")
@click.option(
    "--key",
    "public_key",
    type=click.Path(dir_okay=False),
    help=_KEY_HELP.format(what="trusted public", env="CKPTSTORE_VERIFY_KEY")
    + " With a key, the checkpoint's signature (model.sig) is checked too.",
)
@json_option
@pass_state
def verify_cmd(state: CliState, uuid: str, public_key: str | None, as_json: bool) -> None:
    """Download a checkpoint to a temporary folder and check it against its manifest.

    With a verify key (--key or $CKPTSTORE_VERIFY_KEY) its model-signing signature must also
    match: unsigned, signed by another key or altered is exit 5.
    Exits 0 when every file matches, 5 when one is missing or damaged.

    \b
    Example:
      ckptstore checkpoint verify 0b7c... --key signing-pub.pem
    """
    from ckptstore.checkpointing import signing

    key = signing.verify_key(public_key)
    uuid = full_uuid(state, uuid)
    with tempfile.TemporaryDirectory(prefix="ckptstore-verify-") as tmp:
        # The point is to check what storage holds: nothing comes from the local cache.
        checked = download_checkpoint(
            state, uuid, tmp, label="Verifying", cache=False, verify_key=key
        ).files
    result = {"uuid": uuid, "ok": True, "files": len(checked), "bytes": sum(checked.values())}
    if key is not None:  # the result of an unsigned check keeps its keys
        result["signature"] = "verified"
    if as_json:
        emit_json(result)
    else:
        signed = ", signature verified" if key is not None else ""
        click.echo(
            f"OK: {uuid}: {len(checked)} files, {human_size(result['bytes'])} match the "
            f"manifest{signed}"
        )


@checkpoint.command("sign")
@click.argument("uuid")
@click.option(
    "--key",
    "private_key",
    type=click.Path(dir_okay=False),
    help=_KEY_HELP.format(what="private", env="CKPTSTORE_SIGNING_KEY"),
)
@json_option
@pass_state
def sign_cmd(state: CliState, uuid: str, private_key: str | None, as_json: bool) -> None:
    """Sign a committed checkpoint (adds model.sig, OpenSSF model-signing's format).

    Downloads and verifies the checkpoint, signs its files and adds the signature to the same
    checkpoint. A downloaded copy then verifies with `model_signing verify key`.

    \b
    Example:
      ckptstore checkpoint sign 0b7c... --key signing-key.pem
    """
    from ckptstore.checkpointing import amend, signing

    key = signing.key_from(private_key, signing.SIGNING_KEY_ENV)
    if key is None:
        raise errors.InvalidConfig(
            "No signing key: pass --key KEY.pem or set CKPTSTORE_SIGNING_KEY. Received: none."
        )
    record = state.registry().get_checkpoint(uuid)
    uuid = record.uuid  # a unique prefix names the whole UUID from here on
    with tempfile.TemporaryDirectory(prefix="ckptstore-sign-") as tmp:
        folder, staging = os.path.join(tmp, "ckpt"), os.path.join(tmp, "add")
        digests: dict[str, str] = {}  # hashed by the download's checksum read
        download_checkpoint(state, uuid, folder, label="Signing", sha256=digests)
        if os.path.exists(os.path.join(folder, signing.SIGNATURE_NAME)):
            raise errors.CheckpointConflict(
                f"Checkpoint {uuid} is already signed; to sign it again delete the old "
                f"signature first: ckptstore checkpoint delete {uuid} --glob "
                f"{signing.SIGNATURE_NAME}. Received: {uuid}."
            )
        os.makedirs(staging)
        covered = {rel: digests[rel] for rel in signing.signed_names(digests)}
        signing.sign_digests(covered, key, os.path.join(staging, signing.SIGNATURE_NAME), name=uuid)
        amend.add_files(state.storage_for(record), uuid, staging, index=state.registry())
    if as_json:
        emit_json({"uuid": uuid, "signature": signing.SIGNATURE_NAME})
    else:
        click.echo(f"Signed {uuid} ({signing.SIGNATURE_NAME})")


@checkpoint.command("delete")
@click.argument("uuids", nargs=-1, required=True)
@click.option(
    "--glob",
    "globs",
    multiple=True,
    metavar="GLOB",
    help="Delete only matching files (repeatable).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@pass_state
def delete_cmd(state: CliState, uuids: tuple[str, ...], globs: tuple[str, ...], yes: bool) -> None:
    """Delete checkpoints (or only some of their files with --glob).

    Checkpoints registered as a model version, or pinned by a running process (the checkpoint it
    resumed from or is restoring), are refused.

    \b
    Example:
      ckptstore checkpoint delete 0b7c... --glob 'saved_model/*' -y
    """
    registry = state.registry()
    records = [find_checkpoint(state, uuid) for uuid in uuids]
    refuse_protected(registry, records)
    what = f"files matching {', '.join(globs)} of" if globs else ""
    if not yes:
        click.confirm(f"Delete {what} {len(records)} checkpoint(s)?", abort=True, err=True)
    delete_checkpoints(state, records, globs)


def refuse_protected(registry: Any, records: list[Any]) -> None:
    """InvalidConfig when one of ``records`` is pinned by a running process or registered as
    a model version (nothing is deleted then)."""
    protected = registry.protected_checkpoint_uuids()
    pinned = {pin.uuid for pin in registry.list_pins()}
    for record in records:
        if record.uuid in pinned:
            raise errors.InvalidConfig(
                f"Checkpoint {record.uuid} is pinned by a running process (a run resumed from it "
                "or is restoring it); try again when that process has finished (a crashed "
                "process's pin expires with its lease)."
            )
        if record.uuid in protected:
            raise errors.InvalidConfig(
                f"Checkpoint {record.uuid} is registered as a model version; delete that version "
                "first (`ckptstore model describe NAME`)."
            )


def delete_checkpoints(state: CliState, records: list[Any], globs: tuple[str, ...] = ()) -> None:
    """Delete ``records``' files (or only those matching ``globs``) from their storage and
    mark them in the registry, printing one line each."""
    from ckptstore.checkpointing import CheckpointContext

    registry = state.registry()
    what = f"files matching {', '.join(globs)} of" if globs else ""
    for record in records:
        context = CheckpointContext(state.storage_for(record), index=registry)
        try:
            context.delete(record.uuid, globs=list(globs) or None)
        finally:
            context.close()
        click.echo(f"Deleted {what + ' ' if what else ''}{record.uuid}")


@checkpoint.command("export")
@click.argument("uuid")
@click.option(
    "--no-verify",
    is_flag=True,
    help="Skip comparing the SavedModel's predictions with the Keras model's.",
)
@click.option(
    "--unsafe-deserialization",
    is_flag=True,
    help="Allow Lambda layers (runs code stored in the checkpoint; only for checkpoints you trust).",
)
@click.option(
    "--module",
    "modules",
    multiple=True,
    help="A module defining the model's custom layers that may be imported (repeatable); "
    "the checkpoint's config alone never makes ckptstore import anything.",
)
@click.option(
    "--key",
    "private_key",
    type=click.Path(dir_okay=False),
    help=_KEY_HELP.format(what="private", env="CKPTSTORE_SIGNING_KEY")
    + " A signed checkpoint is signed again over its files and saved_model/; without a key"
    " its export is refused (exit 2).",
)
@json_option
@pass_state
def export_cmd(
    state: CliState,
    uuid: str,
    no_verify: bool,
    unsafe_deserialization: bool,
    modules: tuple[str, ...],
    private_key: str | None,
    as_json: bool,
) -> None:
    """Add an inference SavedModel (saved_model/) to a committed checkpoint.

    Loads the checkpoint's model.keras, runs model.export(), checks that the SavedModel's
    `serve` predicts what the Keras model does, and adds the files to the same checkpoint
    (same UUID; its manifest is rewritten last, so an interrupted export leaves the checkpoint
    as it was). Custom layers must be importable (PYTHONPATH) and allowed with --module
    (exit 5, nothing imported, when the model names a module that is not). A signed
    checkpoint needs its signing key (--key): it is signed again over saved_model/ too.

    \b
    Example:
      ckptstore checkpoint export 0b7c...
      python -c "import tensorflow as tf; tf.saved_model.load('ckpt/saved_model').serve"
    """
    # In a child process: the command itself never imports TensorFlow (layers contract).
    uuid = full_uuid(state, uuid)
    command = [sys.executable, "-m", "ckptstore.keras_io.exporting", "checkpoint", uuid]
    command += ["--registry", state.registry_url]
    if no_verify:
        command.append("--no-verify")
    if unsafe_deserialization:
        command.append("--unsafe-deserialization")
    for module in modules:
        command += ["--module", module]
    from ckptstore.checkpointing import signing

    # The caller's storage, always (its options too; in the environment, never on the command
    # line): a registry row's URL is read only when it is under it (or allowed;
    # ckptstore.checkpointing.row_storage).
    env = {**os.environ, defaults.STORAGE_ENV: state.storage_config.to_env()}
    key = signing.key_from(private_key, signing.SIGNING_KEY_ENV)  # a missing file: exit 2 here
    if key is not None:
        env[signing.SIGNING_KEY_ENV] = os.path.abspath(key)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p or os.getcwd() for p in sys.path))
    proc = subprocess.run(command, stdout=subprocess.PIPE, env=env, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise errors.ExportError(
            f"The export process exited with code {proc.returncode} without a result; see "
            "the messages above."
        ) from None
    if "error" in report:
        error_type = getattr(errors, str(report["error"]), errors.ExportError)
        if not (isinstance(error_type, type) and issubclass(error_type, errors.CkptstoreError)):
            error_type = errors.ExportError
        raise error_type(report["message"])
    if as_json:
        emit_json({"uuid": uuid, **report})
        return
    check = (
        f", serve matches Keras (max |diff| {report['max_abs_diff']:.2g})"
        if report["verified"]
        else ""
    )
    click.echo(f"Exported {uuid} to {report['path']} in {report['seconds']:.1f} s{check}")
