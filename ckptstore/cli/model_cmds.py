"""``ckptstore model ...``: registered models, their versions and aliases.

Example::

    $ ckptstore model create mnist
    $ ckptstore model register-version mnist 0b7c...
    $ ckptstore model set-alias mnist 1 production
    $ ckptstore model download mnist@production -o ./model
"""

from __future__ import annotations

import os
import re

import click

from ckptstore import errors
from ckptstore.cli.download import download_checkpoint, download_options
from ckptstore.cli.output import (
    emit_json,
    emit_record,
    emit_rows,
    human_size,
    json_option,
    render_table,
)
from ckptstore.cli.state import CliState, pass_state
from ckptstore.reports.views import model_view, version_view

_REF_RE = re.compile(r"^(?P<name>[^@:]+)(?:@(?P<alias>[^@:]+)|:(?P<version>-?\d+))?$")
VERSION_COLUMNS = (
    ("version", "Version"),
    ("checkpoint_uuid", "Checkpoint"),
    ("aliases", "Aliases"),
    ("notes", "Notes"),
    ("created_at", "Created"),
)


def parse_model_ref(ref: str) -> tuple[str, int | str]:
    """``"m"`` -> ``("m", -1)``, ``"m:3"`` -> ``("m", 3)``, ``"m@prod"`` -> ``("m", "prod")``."""
    match = _REF_RE.match(ref)
    if not match:
        raise errors.InvalidConfig(
            f"Model reference {ref!r} is malformed; use NAME, NAME:VERSION or NAME@ALIAS."
        )
    if match["alias"]:
        return match["name"], match["alias"]
    return match["name"], int(match["version"]) if match["version"] else -1


#: Alias moves ``model describe`` shows, newest first.
ALIAS_HISTORY_ROWS = 20
ALIAS_HISTORY_COLUMNS = (
    ("moved_at", "When"),
    ("alias", "Alias"),
    ("version", "To"),
    ("previous", "From"),
    ("moved_by", "By"),
)


@click.group()
def model() -> None:
    """Registered models: create, list, versions, aliases, download.

    \b
    Example:
      ckptstore model create mnist --description "digits"
      ckptstore model download mnist@production -o ./model
    """


@model.command("create")
@click.argument("name")
@click.option("--description", default="", help="Free text.")
@click.option("--label", "labels", multiple=True, help="A label (repeatable).")
@json_option
@pass_state
def create_cmd(
    state: CliState, name: str, description: str, labels: tuple[str, ...], as_json: bool
) -> None:
    """Create a registered model.

    \b
    Example:
      ckptstore model create mnist --label vision
    """
    created = state.registry().create_model(
        name, description=description, labels=list(labels) or None
    )
    if as_json:
        emit_json(model_view(created))
    else:
        click.echo(f"Created model {created.name}")


@model.command("list")
@click.option("--archived", is_flag=True, help="Include archived models.")
@json_option
@pass_state
def list_cmd(state: CliState, archived: bool, as_json: bool) -> None:
    """List registered models.

    \b
    Example:
      ckptstore model list --json
    """
    rows = []
    for item in state.registry().list_models(include_archived=archived):
        view = model_view(item)
        view["versions"] = len(item.list_versions())
        rows.append(view)
    columns = (
        ("name", "Name"),
        ("versions", "Versions"),
        ("labels", "Labels"),
        ("archived", "Archived"),
        ("description", "Description"),
    )
    emit_rows(rows, columns, as_json)


@model.command("describe")
@click.argument("name")
@json_option
@pass_state
def describe_cmd(state: CliState, name: str, as_json: bool) -> None:
    """Show a model and its versions.

    \b
    Example:
      ckptstore model describe mnist
    """
    item = state.registry().get_model(name)
    view = model_view(item)
    view["versions"] = [version_view(v) for v in item.list_versions()]
    view["alias_history"] = item.alias_history(limit=ALIAS_HISTORY_ROWS)
    if as_json:
        emit_json(view)
        return
    versions, history = view.pop("versions"), view.pop("alias_history")
    emit_record(view, False, title=f"Model {name}")
    click.echo("versions:")
    click.echo(render_table(versions, VERSION_COLUMNS))
    if history:
        click.echo(f"alias moves (newest {ALIAS_HISTORY_ROWS}):")
        click.echo(render_table(history, ALIAS_HISTORY_COLUMNS))


@model.command("register-version")
@click.argument("name")
@click.argument("uuid")
@json_option
@pass_state
def register_version_cmd(state: CliState, name: str, uuid: str, as_json: bool) -> None:
    """Register checkpoint UUID as the next version of model NAME.

    \b
    Example:
      ckptstore model register-version mnist 0b7c...
    """
    version = state.registry().get_model(name).register_version(uuid)
    if as_json:
        emit_json(version_view(version))
    else:
        click.echo(f"Registered {uuid} as {name}:{version.version}")


@model.command("set-alias")
@click.argument("name")
@click.argument("version", type=int)
@click.argument("alias")
@pass_state
def set_alias_cmd(state: CliState, name: str, version: int, alias: str) -> None:
    """Point ALIAS of model NAME at VERSION (taking it from any other version).

    \b
    Example:
      ckptstore model set-alias mnist 2 production
    """
    if alias.lstrip("-").isdigit():
        raise errors.InvalidConfig(
            f"Alias {alias!r} looks like a version number; use a name such as 'production'."
        )
    state.registry().get_model(name).set_alias(version, alias)
    click.echo(f"{name}@{alias} -> version {version}")


@model.command("download")
@click.argument("ref", metavar="NAME[@ALIAS|:VERSION]")
@download_options("./NAME-vN")
@pass_state
def download_cmd(
    state: CliState, ref: str, out_dir: str | None, selectors: tuple[str, ...], no_cache: bool
) -> None:
    """Download the checkpoint behind a model version (latest, :VERSION or @ALIAS).

    \b
    Example:
      ckptstore model download mnist@production -o ./model
      ckptstore model download mnist:2
    """
    from ckptstore.checkpointing import signing

    name, which = parse_model_ref(ref)
    version = state.registry().get_model(name).get_version(which)
    view = version_view(version)
    out_dir = out_dir or os.path.join(os.getcwd(), f"{name}-v{view['version']}")
    checked = download_checkpoint(
        state,
        view["checkpoint_uuid"],
        out_dir,
        list(selectors) or None,
        cache=False if no_cache else None,
        verify_key=signing.verify_key(),
    ).files
    click.echo(
        f"Downloaded {name}:{view['version']} (checkpoint {view['checkpoint_uuid']}, "
        f"{len(checked)} files, {human_size(sum(checked.values()))}) to {out_dir}"
    )
