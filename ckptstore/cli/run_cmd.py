"""``ckptstore run -- python3 train.py``: run a Determined script unchanged, outside experiments.

The command after ``--`` runs with ``import determined`` resolving to ckptstore (only in that
process and its children), a leading ``python``/``python3`` replaced by ckptstore's interpreter,
the current folder on ``PYTHONPATH``, and the global ``--storage`` / ``--registry`` passed on as
``CKPTSTORE_STORAGE`` / ``CKPTSTORE_REGISTRY`` (see :mod:`ckptstore.launch.process`).

The script always runs as a trial (``det.get_cluster_info()`` is not None), as every run is a
trial on Determined: ``--trial-id N`` names it (run again, Determined scripts resume from that
trial's latest checkpoint); without it a new trial is created and its id printed on stderr
(pass it as ``--trial-id`` to resume that run). ``--config FILE`` passes an
experiment config's constant ``hyperparameters``, ``data`` and ``resources.slots_per_trial``.
The command replaces this process: signals reach it directly and its exit status is
``ckptstore run``'s.

Example::

    $ ckptstore --storage s3://bucket/ckpts run --trial-id 7 -- python3 train.py --epochs 5
"""

from __future__ import annotations

import json
import os

import click

from ckptstore import errors


@click.command(
    "run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "--trial-id",
    type=int,
    default=None,
    help="Run as this trial (resumes it). Default: a new trial, its id printed.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Experiment config: its constant hyperparameters, data and resources.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def run(ctx: click.Context, trial_id: int | None, config_path: str | None, command: tuple) -> None:
    """Run COMMAND with `import determined` resolving to ckptstore.

    \b
    Example:
      ckptstore run -- python3 train.py --epochs 3
      ckptstore --storage s3://b/ckpts run --trial-id 7 -- python3 -m determined.launch.tensorflow -- python3 train.py
    """
    from ckptstore.core import info as trial_info
    from ckptstore.experiment.common import child_process_env, run_settings
    from ckptstore.launch.process import child_command

    argv = list(command)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise errors.InvalidConfig(
            "ckptstore run needs a command. Received: nothing. Write "
            "`ckptstore run -- python3 train.py`."
        )
    state = ctx.obj
    settings = run_settings(
        storage=getattr(state, "storage_config", None),
        registry_url=getattr(state, "registry_url", None) or None,
    )
    hparams: dict = {}
    if config_path is not None:
        from ckptstore.experiment.config import load_config

        config = load_config(config_path)
        ranged = [hp.name for hp in config.hyperparameters if hp.type != "const"]
        if ranged:
            raise errors.InvalidConfig(
                f"ckptstore run --config takes constant hyperparameters. Received ranges for "
                f"{', '.join(ranged)}. Search them with `ckptstore experiment create`."
            )
        hparams = config.constant_hparams()
        settings[trial_info.HPARAMS_ENV] = json.dumps(hparams)
        settings.update(run_settings(data=config.data, slots=config.slots_per_trial))
    if trial_id is None:  # every run is a trial (Determined's rule): a new one
        from ckptstore.cli.state import CliState

        owner = state if isinstance(state, CliState) else CliState()
        trial_id = owner.registry().create_trial(hparams=hparams)
        owner.close()  # the command replaces this process: nothing is left open
        click.echo(f"ckptstore run: trial {trial_id} (again: --trial-id {trial_id})", err=True)
    settings[trial_info.TRIAL_ID_ENV] = str(trial_id)
    env = child_process_env(os.environ, settings, model_dir=os.getcwd(), who="ckptstore run")
    argv = child_command(argv, env)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise errors.InvalidConfig(
            f"Cannot run {argv[0]!r}: {exc.strerror}. Check the command after `--`."
        ) from None


__all__ = ["run"]
