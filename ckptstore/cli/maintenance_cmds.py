"""``ckptstore gc``, ``ckptstore reindex`` and ``ckptstore storage validate``.

Example::

    $ ckptstore gc --dry-run --save-trial-latest 2
    $ ckptstore reindex
    $ ckptstore storage validate
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import click

from ckptstore import errors
from ckptstore.checkpointing.retention import DETERMINED_DEFAULTS
from ckptstore.cli.output import emit_json, json_option
from ckptstore.cli.state import CliState, pass_state


@click.command()
@click.option("--dry-run", is_flag=True, help="Only print what would be deleted.")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Delete without asking. Without it, gc asks after a dry run on a terminal and refuses "
    "to delete anywhere else.",
)
@click.option(
    "--save-trial-latest",
    type=int,
    default=DETERMINED_DEFAULTS["save_trial_latest"],
    show_default=True,
    help="Newest checkpoints kept per trial.",
)
@click.option(
    "--save-trial-best",
    type=int,
    default=DETERMINED_DEFAULTS["save_trial_best"],
    show_default=True,
    help="Best checkpoints kept per trial (by --metric, else the experiment's searcher metric; "
    "with neither, every checkpoint is kept).",
)
@click.option(
    "--save-experiment-best",
    type=int,
    default=DETERMINED_DEFAULTS["save_experiment_best"],
    show_default=True,
    help="Best checkpoints kept per experiment.",
)
@click.option(
    "--metric",
    default=None,
    help="Metric that ranks 'best' (default: the experiment's searcher metric).",
)
@click.option(
    "--larger-is-better",
    is_flag=True,
    default=None,
    help="Higher --metric is better (default: smaller, or the searcher's direction).",
)
@click.option("--trial", "trial_id", type=int, help="Only this trial (default: every trial).")
@json_option
@pass_state
def gc(
    state: CliState,
    trial_id: int | None,
    dry_run: bool,
    yes: bool,
    save_trial_latest: int,
    save_trial_best: int,
    save_experiment_best: int,
    metric: str | None,
    larger_is_better: bool | None,
    as_json: bool,
) -> None:
    """Delete checkpoints the retention policy no longer keeps (Determined's defaults).

    The policy applies per trial, like Determined's checkpoint_storage GC keys. "Best" is judged
    by --metric, else by the searcher metric of the trial's experiment; when neither is known
    the best rules keep every checkpoint (and say so). Never deleted: checkpoints registered as
    model versions, and checkpoints pinned by a running process (the checkpoint a training run
    resumed from, or one being restored); a pin of a process that crashed expires with its
    lease (10 minutes by default). Uncommitted leftovers older than the grace period are
    removed too. Nothing is deleted without --yes: on a terminal gc shows a dry run and asks.

    \b
    Example:
      ckptstore gc --dry-run
      ckptstore gc --save-trial-latest 2 --save-trial-best 1 --metric val_loss --yes
    """
    from ckptstore.checkpointing import CheckpointContext
    from ckptstore.checkpointing.retention import GCPolicy

    policy = GCPolicy.from_determined(
        save_trial_latest=save_trial_latest,
        save_trial_best=save_trial_best,
        save_experiment_best=save_experiment_best,
        metric=metric,
        smaller_is_better=None if larger_is_better is None else not larger_is_better,
    )
    registry = state.registry()
    trials = [registry.get_trial(trial_id)] if trial_id is not None else registry.list_trials()

    def run(dry: bool) -> list[str]:
        deleted: list[str] = []
        # One warning per cause, not one per trial (a registry of many trials repeated it).
        with _each_warning_once("ckptstore.checkpointing.retention"):
            for trial in trials:
                context = CheckpointContext(
                    state.storage(),
                    index=registry,
                    trial_id=trial.id,
                    experiment_id=trial.experiment_id,
                    gc_policy=policy,
                )
                try:
                    deleted += [u for u in context.gc(dry_run=dry) if u not in deleted]
                finally:
                    context.close()
        return deleted

    if not dry_run and not yes:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise errors.InvalidConfig(
                "ckptstore gc deletes checkpoints and was given neither --yes nor --dry-run. "
                "Run `ckptstore gc --dry-run` to see what it would delete, then "
                "`ckptstore gc --yes` (same options) to delete it."
            )
        would = run(True)
        for uuid in would:
            click.echo(f"Would delete {uuid}")
        if not would:
            click.echo("Nothing to delete.")
            return
        click.confirm(f"Delete these {len(would)} checkpoint(s)?", abort=True, err=True)
    deleted = run(dry_run)
    if as_json:
        emit_json({"dry_run": dry_run, "deleted": deleted})
        return
    verb = "Would delete" if dry_run else "Deleted"
    for uuid in deleted:
        click.echo(f"{verb} {uuid}")
    click.echo(f"{verb} {len(deleted)} checkpoint(s).")


@contextlib.contextmanager
def _each_warning_once(logger_name: str) -> Iterator[None]:
    """While in the block, ``logger_name`` logs each distinct message once."""
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in seen:
            return False
        seen.add(message)
        return True

    logger = logging.getLogger(logger_name)
    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


@click.command()
@json_option
@pass_state
def reindex(state: CliState, as_json: bool) -> None:
    """Rebuild the registry's checkpoint rows from what is in storage.

    Rows whose checkpoint no longer exists in storage are marked DELETED. A damaged
    checkpoint is listed and left out; the others are indexed.

    \b
    Example:
      ckptstore --storage s3://bucket/ckpts --registry sqlite:///new.db reindex
    """
    skipped: dict[str, str] = {}
    count = state.registry().reindex(state.storage(), skipped=skipped)
    if as_json:
        emit_json({"storage": state.storage().url, "checkpoints": count, "skipped": skipped})
        return
    for uuid, why in sorted(skipped.items()):
        click.echo(f"Left out {uuid}: {why}", err=True)
    click.echo(f"Indexed {count} checkpoint(s) from {state.storage().url}")
    if skipped:
        click.echo(f"Left out {len(skipped)} damaged checkpoint(s) (listed above).")


@click.group()
def storage() -> None:
    """Check the checkpoint storage.

    \b
    Example:
      ckptstore --storage s3://bucket/ckpts storage validate
    """


@storage.command("validate")
@click.option(
    "--blobs",
    "blob_sample",
    default="32",
    show_default=True,
    metavar="N|all",
    help="Deduplicated checkpoints: read N shared chunks picked at random (or all; 0: none) "
    "and check their SHA-256. Every chunk a committed manifest names is checked to exist "
    "either way (one listing).",
)
@pass_state
def validate_cmd(state: CliState, blob_sample: str) -> None:
    """Write, read back and delete a probe object (exit 4 on failure); then check the blob
    store of deduplicated checkpoints (exit 5 when a chunk is missing or damaged, naming
    every checkpoint that uses it).

    \b
    Example:
      ckptstore --storage gs://bucket/ckpts storage validate
      ckptstore --storage gs://bucket/ckpts storage validate --blobs all
    """
    from ckptstore.checkpointing import blob_gc, blobs

    if blob_sample == "all":
        sample = None
    elif blob_sample.isdigit():
        sample = int(blob_sample)
    else:
        raise click.BadParameter("expected a number of chunks or 'all'", param_hint="--blobs")
    target = state.storage()
    target.validate()
    click.echo(f"OK: {target.url} can be written, read and deleted")
    if not target.exists(blobs.BLOBS_DIR):
        return
    report = blob_gc.check(target, sample)
    for kind in ("missing", "damaged"):
        for sha, users in report[kind].items():
            click.echo(
                f"Blob {sha} is {kind}; checkpoints using it ({len(users)}): " + ", ".join(users),
                err=True,
            )
    if report["missing"] or report["damaged"]:
        raise errors.ChecksumMismatch(
            f"{len(report['missing'])} missing and {len(report['damaged'])} damaged blob(s) in "
            f"{target.url}/{blobs.BLOBS_DIR} (listed above with the checkpoints using them); "
            "those checkpoints cannot be restored. Restore the blobs or delete the checkpoints."
        )
    click.echo(
        f"OK: {report['referenced']} chunk(s) named by committed checkpoints are stored; "
        f"{report['checked']} read back with a matching SHA-256"
    )
