"""``ckptstore import-determined``: register checkpoints written by Determined.

Example::

    $ ckptstore import-determined /old/checkpoints --trial 7
    $ ckptstore import-determined s3://old-bucket/det/0b7c... --trust-pickle --json
"""

from __future__ import annotations

import dataclasses

import click

from ckptstore.cli.output import emit_rows, json_option
from ckptstore.cli.state import CliState, pass_state


@click.command("import-determined")
@click.argument("source", metavar="PATH_OR_URL")
@click.option("--trial", "trial_id", type=int, help="Trial id to register the checkpoints under.")
@click.option(
    "--experiment", "experiment_id", type=int, help="Experiment id to register them under."
)
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Read pickled files (callback_state, rng_state.pkl, ...). Pickles run code when read: "
    "only for checkpoints you trust. Without it they are copied unread.",
)
@json_option
@pass_state
def import_determined(
    state: CliState,
    source: str,
    trial_id: int | None,
    experiment_id: int | None,
    trust_pickle: bool,
    as_json: bool,
) -> None:
    """Register Determined checkpoints (DeterminedCallback or TFKerasTrial) in ckptstore.

    PATH_OR_URL is one checkpoint folder or a folder of them, local or on any storage URL.
    Files are copied into --storage and recorded in --registry. Load the weights later with
    ckptstore.keras.load_determined_checkpoint(model, path).

    \b
    Example:
      ckptstore import-determined ./det-ckpts --trial 7
      ckptstore import-determined s3://old/det/0b7c... --trust-pickle
    """
    from ckptstore.import_determined.layouts import import_determined as run_import

    imported = run_import(
        source,
        storage=state.storage(),
        index=state.registry(),
        trial_id=trial_id,
        experiment_id=experiment_id,
        trust_pickle=trust_pickle,
    )
    rows = [dataclasses.asdict(item) for item in imported]
    columns = (
        ("uuid", "UUID"),
        ("steps_completed", "Steps"),
        ("layout", "Layout"),
        ("source", "Source"),
        ("pickles_skipped", "Pickles skipped"),
    )
    emit_rows(rows, columns, as_json)
    for item in imported:
        if item.pickles_skipped:
            click.echo(
                f"Warning: {item.source}: pickled file(s) {', '.join(item.pickles_skipped)} were "
                "copied but not read (pickles can run code when read); pass --trust-pickle to "
                "import epoch/continue_id from them.",
                err=True,
            )
