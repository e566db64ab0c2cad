"""The ``ckptstore`` command: checkpoints, trials, models, GC and reports from a terminal.

Verbs live in small modules (``checkpoint_cmds``, ``trial_cmds``, ...) that are imported only
when their verb runs, so ``ckptstore --help`` and storage/registry verbs never import
TensorFlow.

Example::

    $ ckptstore --storage s3://bucket/ckpts --registry sqlite:///reg.db checkpoint list --json
    $ python -m ckptstore.cli.main trial describe 3
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from ckptstore import __version__
from ckptstore.cli.errors import EXIT_CODES_HELP, translate_error
from ckptstore.cli.state import CliState, StorageParam
from ckptstore.masking import install_log_filter

if TYPE_CHECKING:  # pragma: no cover
    from ckptstore.storage_backends.spec import StorageConfig

logger = logging.getLogger(__name__)

#: verb -> (module:attribute, one-line help shown by ``ckptstore --help``).
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "checkpoint": (
        "ckptstore.cli.checkpoint_cmds:checkpoint",
        "List, describe, download, verify, delete and export checkpoints.",
    ),
    "trial": (
        "ckptstore.cli.trial_cmds:trial",
        "List and describe trials; write a trial's HTML report.",
    ),
    "model": (
        "ckptstore.cli.model_cmds:model",
        "Registered models: create, list, versions, aliases, download.",
    ),
    "experiment": (
        "ckptstore.cli.experiment_group:experiment",
        "Experiments: create/resume/describe/list and HTML reports.",
    ),
    "gc": (
        "ckptstore.cli.maintenance_cmds:gc",
        "Delete checkpoints the retention policy no longer keeps.",
    ),
    "reindex": (
        "ckptstore.cli.maintenance_cmds:reindex",
        "Rebuild the registry's checkpoint rows from storage.",
    ),
    "storage": (
        "ckptstore.cli.maintenance_cmds:storage",
        "Check that the storage can be written, read and deleted.",
    ),
    "ui": (
        "ckptstore.cli.ui_cmd:ui",
        "Serve a web view of experiments, trials, checkpoints and models.",
    ),
    "run": (
        "ckptstore.cli.run_cmd:run",
        "Run a Determined script unchanged: ckptstore run -- python3 train.py.",
    ),
    "job": (
        "ckptstore.cli.job_cmds:job",
        "Non-training jobs (batch inference, evaluation): run, list, describe, logs.",
    ),
    "cache": (
        "ckptstore.cli.cache_cmds:cache",
        "The local restore cache of loaded checkpoints: info, clear.",
    ),
    "import-determined": (
        "ckptstore.cli.import_cmd:import_determined",
        "Register checkpoints written by Determined.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use (and errors made typed)."""

    def __init__(
        self, *args: object, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module_name, attr = self.lazy[cmd_name][0].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table, so --help imports nothing.
        rows = [(name, self.lazy[name][1]) for name in sorted(self.lazy)]
        rows += [
            (n, c.get_short_help_str())
            for n, c in sorted(self.commands.items())
            if n not in self.lazy
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.exceptions.ClickException:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to exit codes, re-raised otherwise
            translated = translate_error(exc)
            if translated is None:
                raise
            raise translated from exc


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXIT_CODES_HELP,
)
@click.option(
    "--storage",
    envvar="CKPTSTORE_STORAGE",
    type=StorageParam(),
    metavar="URL",
    help="Checkpoint storage URL (s3://, gs://, az://, a path, ...) or a JSON checkpoint_storage "
    "object. Env: CKPTSTORE_STORAGE.",
)
@click.option(
    "--registry",
    envvar="CKPTSTORE_REGISTRY",
    metavar="URL",
    help="Registry database (sqlite:///file.db, postgresql://...). Env: CKPTSTORE_REGISTRY.",
)
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv for debug).")
@click.version_option(__version__, prog_name="ckptstore")
@click.pass_context
def cli(
    ctx: click.Context, storage: StorageConfig | None, registry: str | None, verbose: int
) -> None:
    """ckptstore: Keras checkpoints on any storage, with a registry.

    \b
    Example:
      ckptstore --storage s3://bucket/ckpts --registry sqlite:///reg.db checkpoint list
      ckptstore checkpoint download 0b7c... -o ./ckpt
      ckptstore experiment report 1 -o report.html
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("ckptstore").setLevel(level)
    # Log lines can quote URLs and configs: the handlers print them through the masking rule.
    install_log_filter(handlers=logging.getLogger().handlers)
    state = CliState(storage=storage, registry_url=registry)
    ctx.obj = state
    ctx.call_on_close(state.close)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (``ckptstore``); exits with the documented codes."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="ckptstore")


if __name__ == "__main__":
    main()
