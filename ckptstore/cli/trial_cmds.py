"""``ckptstore trial ...``: list, describe and delete trials, write a trial's HTML report.

Example::

    $ ckptstore trial list --experiment 1
    $ ckptstore trial describe 3 --json
    $ ckptstore trial report 3 -o trial3.html
    $ ckptstore trial delete 3 --yes
"""

from __future__ import annotations

import click

from ckptstore import errors
from ckptstore.checkpointing.index import STATES as ALL_STATES
from ckptstore.cli.output import emit_json, emit_rows, format_cell, json_option, render_table
from ckptstore.cli.report_file import report_output_option, write_html_report
from ckptstore.cli.state import CliState, pass_state
from ckptstore.registry.entities import LOST
from ckptstore.reports.views import checkpoint_view, metric_view, trial_view

LIST_COLUMNS = (
    ("id", "ID"),
    ("experiment_id", "Exp"),
    ("status", "State"),
    ("hparams", "Hyperparameters"),
    ("created_at", "Created"),
)


@click.group()
def trial() -> None:
    """List, describe and delete trials; write a trial's HTML report.

    \b
    Example:
      ckptstore trial describe 3
    """


@trial.command("list")
@click.option("--experiment", "experiment_id", type=int, help="Only this experiment's trials.")
@json_option
@pass_state
def list_cmd(state: CliState, experiment_id: int | None, as_json: bool) -> None:
    """List trials.

    \b
    Example:
      ckptstore trial list --experiment 1 --json
    """
    registry = state.registry()
    if experiment_id is not None:
        registry.get_experiment(experiment_id)
    emit_rows(
        [trial_view(t) for t in registry.list_trials(experiment_id=experiment_id)],
        LIST_COLUMNS,
        as_json,
    )


def describe_trial(state: CliState, trial_id: int) -> dict:
    """Trial fields, latest metrics per group, and its checkpoints."""
    registry = state.registry()
    view = trial_view(registry.get_trial(trial_id))
    metrics = [metric_view(m) for m in registry.get_metrics(trial_id)]
    latest: dict[str, dict] = {}
    for row in metrics:
        latest[row["group"]] = {"steps_completed": row["steps_completed"], **row["metrics"]}
    view["latest_metrics"] = latest
    view["metric_rows"] = len(metrics)
    view["checkpoints"] = [checkpoint_view(c) for c in registry.list_checkpoints(trial_id=trial_id)]
    return view


@trial.command("describe")
@click.argument("trial_id", type=int)
@json_option
@pass_state
def describe_cmd(state: CliState, trial_id: int, as_json: bool) -> None:
    """Show a trial: hyperparameters, latest metrics and checkpoints.

    \b
    Example:
      ckptstore trial describe 3
    """
    view = describe_trial(state, trial_id)
    if as_json:
        emit_json(view)
        return
    click.echo(
        f"Trial {view['id']} (experiment {format_cell(view['experiment_id'])}): {view['status']}"
    )
    if view["status"] == LOST:
        click.echo(
            f"  its process stopped without saying so: last heartbeat "
            f"{format_cell(view['heartbeat_at'])}"
        )
    click.echo(f"created: {format_cell(view['created_at'])}")
    click.echo("hyperparameters:")
    for key, value in sorted(view["hparams"].items()):
        click.echo(f"  {key}: {format_cell(value)}")
    click.echo("latest metrics:")
    for group, values in sorted(view["latest_metrics"].items()):
        click.echo(f"  {group}: {format_cell(values)}")
    click.echo("checkpoints:")
    columns = (
        ("uuid", "UUID"),
        ("steps_completed", "Steps"),
        ("state", "State"),
        ("metrics", "Metrics"),
    )
    click.echo(render_table(view["checkpoints"], columns))


@trial.command("report")
@click.argument("trial_id", type=int)
@report_output_option
@pass_state
def report_cmd(state: CliState, trial_id: int, out_path: str) -> None:
    """Write one self-contained HTML page: metric curves, hyperparameters, checkpoints.

    \b
    Example:
      ckptstore trial report 3 -o trial3.html
    """
    from ckptstore.reports import collect_trial_report

    write_html_report(collect_trial_report(state.registry(), trial_id), out_path)


@trial.command("delete")
@click.argument("trial_id", type=int)
@click.option("--yes", "-y", is_flag=True, help="Delete: without it nothing is deleted.")
@pass_state
def delete_cmd(state: CliState, trial_id: int, yes: bool) -> None:
    """Delete a trial with its checkpoints (files in storage included) and its metrics.

    Refused (nothing deleted) while one of its checkpoints is registered as a model version or
    pinned by a running process. Checkpoints in another storage than the default need it named
    (--storage), as for `checkpoint delete`.

    \b
    Example:
      ckptstore trial delete 3 --yes
    """
    from ckptstore.cli.checkpoint_cmds import delete_checkpoints, refuse_protected

    registry = state.registry()
    registry.get_trial(trial_id)  # TrialNotFound -> exit 3
    states = tuple(s for s in ALL_STATES if s != "DELETED")
    records = registry.list_checkpoints(trial_id=trial_id, states=states)
    refuse_protected(registry, records)
    if not yes:
        raise errors.InvalidConfig(
            f"`ckptstore trial delete {trial_id}` deletes the trial and its {len(records)} "
            f"checkpoint(s) from storage, for good. Received no --yes: run "
            f"`ckptstore trial delete {trial_id} --yes` to delete them."
        )
    delete_checkpoints(state, records)
    registry.delete_trial(trial_id)
    click.echo(f"Deleted trial {trial_id} and its {len(records)} checkpoint(s)")
