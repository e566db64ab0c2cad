"""``ckptstore experiment``: create, resume, describe and list experiments (issue 5).

The global ``--storage`` / ``--registry`` options of ``ckptstore`` apply; ``--storage`` given
explicitly (or ``CKPTSTORE_STORAGE``) overrides the config's ``checkpoint_storage``.

Example::

    $ ckptstore experiment create examples/mnist_tfkeras_trial/const.yaml examples/mnist_tfkeras_trial
    $ ckptstore experiment describe 1
"""

from __future__ import annotations

import json
import logging
import signal
from typing import TYPE_CHECKING, Any

import click

from ckptstore import defaults, errors
from ckptstore.cli.output import json_option
from ckptstore.masking import mask_value

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.experiment.runner import RunOutcome
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)


def _targets(ctx: click.Context) -> tuple[StorageConfig | None, str | None]:
    """(storage, registry) from the parent ``ckptstore`` command. Storage is None unless
    ``--storage`` (or ``CKPTSTORE_STORAGE``) named something other than the default, so the
    config's ``checkpoint_storage`` applies when the option was not given."""
    storage = getattr(ctx.obj, "storage_config", None)
    registry = getattr(ctx.obj, "registry_url", None)
    if storage is not None and storage.spec == defaults.default_storage_url():
        storage = None
    return storage, registry


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")


@click.group("experiment")
def experiment() -> None:
    """Run experiments (TFKerasTrial classes or training scripts) with hyperparameter search.

    \b
    Example:
      ckptstore experiment create const.yaml .
      ckptstore experiment describe 1
    """


def _engine_options(fn: Any) -> Any:
    fn = click.option(
        "--address",
        default=None,
        help="Ray cluster address host:port (default: RAY_ADDRESS, else a local Ray).",
    )(fn)
    return click.option(
        "--engine",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="local: trials as processes here; ray: trials as Ray Tune trials on a cluster.",
    )(fn)


@experiment.command("create")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--no-run", is_flag=True, help="Only record the experiment; run it with resume.")
@_engine_options
@click.pass_context
def create_cmd(
    ctx: click.Context,
    config: str,
    model_dir: str,
    no_run: bool,
    engine: str,
    address: str | None,
) -> None:
    """Check CONFIG, record the experiment and run its trials from MODEL_DIR.

    \b
    Example:
      ckptstore experiment create examples/mnist_tfkeras_trial/const.yaml examples/mnist_tfkeras_trial
    """
    from ckptstore.experiment import create_experiment

    _setup_logging()
    storage, registry = _targets(ctx)
    try:
        exp_id = create_experiment(
            config, model_dir, storage=storage, registry=registry, run=False, engine=engine
        )
    except KeyboardInterrupt:
        raise errors.ExperimentInterrupted(
            "Interrupted by Ctrl-C (SIGINT) before the experiment was recorded: nothing ran. "
            "Run the command again."
        ) from None
    click.echo(
        f"Experiment {exp_id} recorded. Other machines sharing this registry and storage can "
        f"work on it too: ckptstore experiment join {exp_id}",
        err=True,
    )
    if not no_run:
        _run_to_end(exp_id, storage, registry, engine=engine, address=address)
    click.echo(f"Created experiment {exp_id}")


def _run_to_end(
    exp_id: int,
    storage: StorageConfig | None,
    registry: str | None,
    model_dir: str | None = None,
    *,
    engine: str = "local",
    address: str | None = None,
) -> None:
    """Run the experiment; exit non-zero (naming failed trials) unless it COMPLETED cleanly,
    130 (:class:`~ckptstore.errors.ExperimentInterrupted`) when Ctrl-C paused it."""
    from ckptstore.experiment import run_experiment

    try:
        outcome = run_experiment(
            exp_id,
            storage=storage,
            registry=registry,
            model_dir=model_dir,
            engine=engine,
            address=address,
        )
    except KeyboardInterrupt:
        # Ctrl-C before the runner took SIGINT over (while it opens the study), or a second
        # one while it stops: nothing runs on, and the trials go on from their checkpoints.
        outcome = _paused(exp_id, registry)
    if outcome.ok:
        return
    if outcome.interrupted_by == signal.SIGINT and not outcome.failed:
        raise errors.ExperimentInterrupted(outcome.message())
    raise errors.ExperimentNotCompleted(outcome.message())


def _paused(exp_id: int, registry: str | None) -> RunOutcome:
    """The experiment marked PAUSED (unless it finished) after a Ctrl-C the runner missed."""
    from ckptstore.experiment.common import registry_url
    from ckptstore.experiment.runner import RunOutcome
    from ckptstore.registry import Registry

    with Registry(registry_url(registry)) as reg:
        state = reg.get_experiment(exp_id).state
        if state not in ("COMPLETED", "ERROR"):
            state = "PAUSED"
            reg.set_experiment_state(exp_id, state)
    return RunOutcome(exp_id, state, [], interrupted_by=signal.SIGINT)


_RESUME_HELP = """Continue every unfinished trial of EXPERIMENT_ID from its latest checkpoint,
then start the trials the searcher still wants.

Run it on several machines that share the registry (PostgreSQL) and the checkpoint storage to
work on one search together: runners take trials from the experiment's Optuna study (no trial
runs twice, exactly max_trials are created), Optuna's heartbeats mark who runs what, and a
runner with nothing left to start waits to continue, from its last checkpoint, the trial of a
runner that dies (re-queued after CKPTSTORE_HEARTBEAT_GRACE, 30 s). `join` is the same command.

\b
Example:
  ckptstore --registry postgresql://me@db/ckpts experiment resume 1
"""


@click.argument("experiment_id", type=int)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="The model folder on this machine (default: the one given to create).",
)
@_engine_options
@click.pass_context
def _resume(
    ctx: click.Context,
    experiment_id: int,
    model_dir: str | None,
    engine: str,
    address: str | None,
) -> None:
    _setup_logging()
    storage, registry = _targets(ctx)
    click.echo(f"Experiment {experiment_id} resumed")
    _run_to_end(experiment_id, storage, registry, model_dir, engine=engine, address=address)


resume_cmd = experiment.command("resume", help=_RESUME_HELP)(_resume)
experiment.add_command(resume_cmd, "join")


@experiment.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of an experiment config (Determined 0.38's keys, types, defaults).

    \b
    Example:
      ckptstore experiment schema > experiment-config.schema.json
    """
    from ckptstore.experiment import config_json_schema

    click.echo(json.dumps(config_json_schema(), indent=2))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@experiment.command("describe")
@click.argument("experiment_id", type=int)
@json_option
@click.pass_context
def describe_cmd(ctx: click.Context, experiment_id: int, as_json: bool) -> None:
    """Show the trials of EXPERIMENT_ID, their hparams, best metric and best checkpoint.

    \b
    Example:
      ckptstore experiment describe 1 --json
    """
    from ckptstore.experiment import describe_experiment

    _, registry = _targets(ctx)
    info = mask_value(describe_experiment(experiment_id, registry=registry))
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    click.echo(
        f"Experiment {info['id']} ({info['state']}) {info['description']}\n"
        f"searcher {info['searcher']}, metric {info['metric']} "
        f"({'smaller' if info['smaller_is_better'] else 'larger'} is better), "
        f"{len(info['trials'])}/{info['max_trials']} trials"
    )
    header = ("trial", "state", "batches", "best " + info["metric"], "best checkpoint", "hparams")
    rows = [
        (
            str(t["id"]),
            t["status"],
            str(t["batches_trained"]),
            _fmt(t["best_metric"]),
            t["best_checkpoint"] or "-",
            json.dumps(t["hparams"], sort_keys=True),
        )
        for t in info["trials"]
    ]
    _table(header, rows)
    click.echo(
        f"best trial {_fmt(info['best_trial'])}: {info['metric']}={_fmt(info['best_metric'])}, "
        f"checkpoint {_fmt(info['best_checkpoint'])}"
    )


@experiment.command("list")
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List experiments.

    \b
    Example:
      ckptstore experiment list --json
    """
    from ckptstore.experiment import list_experiments

    _, registry = _targets(ctx)
    items = mask_value(list_experiments(registry=registry))
    if as_json:
        click.echo(json.dumps(items, indent=2, default=str))
        return
    header = ("id", "state", "searcher", "trials", "description")
    rows = [
        (str(e["id"]), e["state"], str(e["searcher"]), str(e["trials"]), e["description"])
        for e in items
    ]
    _table(header, rows)


__all__ = ["experiment"]
