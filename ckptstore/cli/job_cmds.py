"""``ckptstore job``: run non-training jobs (batch inference, evaluation) and look at them.

Example::

    $ ckptstore job run batch_inference.yaml .
    $ ckptstore job list
    $ ckptstore job logs 1
"""

from __future__ import annotations

import json

import click

from ckptstore.cli.experiment import _setup_logging, _table, _targets
from ckptstore.cli.output import format_cell, json_option
from ckptstore.masking import mask_value


@click.group("job")
def job() -> None:
    """Non-training jobs: `det job run` of Determined's reference, recorded in the registry.

    \b
    Example:
      ckptstore job run batch_inference.yaml .
      ckptstore job describe 1
    """


@job.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.pass_context
def run_cmd(ctx: click.Context, config: str, model_dir: str) -> None:
    """Run the script of CONFIG (entrypoint_script, data, resources.slots) from MODEL_DIR.

    Exits non-zero when the job fails, with the last lines of its log.

    \b
    Example:
      ckptstore job run batch_inference.yaml .
    """
    from ckptstore import errors
    from ckptstore.experiment.jobs import run_job

    _setup_logging()
    storage, registry = _targets(ctx)
    outcome = run_job(config, model_dir, storage=storage, registry=registry)
    if not outcome.ok:
        raise errors.JobFailed(outcome.message())
    click.echo(f"Job {outcome.job_id} completed")


@job.command("list")
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List jobs.

    \b
    Example:
      ckptstore job list --json
    """
    from ckptstore.experiment.jobs import list_jobs

    _, registry = _targets(ctx)
    items = mask_value(list_jobs(registry=registry))
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return
    rows = [
        (
            str(j["id"]),
            j["state"],
            "-" if j["exit_code"] is None else str(j["exit_code"]),
            str(j["entrypoint"]),
        )
        for j in items
    ]
    _table(("id", "state", "exit", "entrypoint"), rows)


@job.command("describe")
@click.argument("job_id", type=int)
@json_option
@click.pass_context
def describe_cmd(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Show a job: state, exit status, data, storage, times.

    \b
    Example:
      ckptstore job describe 1 --json
    """
    from ckptstore.experiment.jobs import describe_job

    _, registry = _targets(ctx)
    info = mask_value(describe_job(job_id, registry=registry))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for key, value in info.items():  # no value: "-", as in every other listing (not "None")
        shown = json.dumps(value) if isinstance(value, dict) else format_cell(value)
        click.echo(f"{key}: {shown}")


@job.command("logs")
@click.argument("job_id", type=int)
@click.pass_context
def logs_cmd(ctx: click.Context, job_id: int) -> None:
    """Print the output of a job's workers.

    \b
    Example:
      ckptstore job logs 1
    """
    from ckptstore.experiment.jobs import job_log

    _, registry = _targets(ctx)
    click.echo(job_log(job_id, registry=registry), nl=False)


__all__ = ["job"]
