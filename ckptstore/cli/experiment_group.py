"""The ``experiment`` verb: the runner's group (create/resume/describe/list) plus ``report``.

The runner's commands live in ``ckptstore.cli.experiment`` (issue 5). When that module is not
installed the group still offers ``report``.

Example::

    $ ckptstore experiment report 1 -o report.html
"""

from __future__ import annotations

import importlib
import logging

import click

from ckptstore.cli.report_file import report_output_option, write_html_report
from ckptstore.cli.state import CliState, pass_state

logger = logging.getLogger(__name__)


@click.command("report")
@click.argument("experiment_id", type=int)
@report_output_option
@pass_state
def report_cmd(state: CliState, experiment_id: int, out_path: str) -> None:
    """Write one self-contained HTML page: every trial's metric curves, hyperparameters and
    checkpoints.

    \b
    Example:
      ckptstore experiment report 1 -o report.html
    """
    from ckptstore.reports import collect_experiment_report

    write_html_report(collect_experiment_report(state.registry(), experiment_id), out_path)


def _runner_group() -> click.Group | None:
    try:
        module = importlib.import_module("ckptstore.cli.experiment")
    except ModuleNotFoundError as exc:
        if exc.name != "ckptstore.cli.experiment":
            raise
        return None
    group = getattr(module, "experiment", None)
    return group if isinstance(group, click.Group) else None


def _build() -> click.Group:
    group = _runner_group()
    if group is None:

        @click.group("experiment")
        def fallback() -> None:
            """Experiments: HTML reports (the runner's create/resume are not installed).

            \b
            Example:
              ckptstore experiment report 1 -o report.html
            """

        group = fallback
    if "report" not in group.commands:
        group.add_command(report_cmd, "report")
    return group


experiment = _build()
