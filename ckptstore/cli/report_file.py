"""What ``trial report`` and ``experiment report`` share: the ``-o FILE.html`` option and
rendering a collected report into that file.

Example::

    @click.command()
    @report_output_option
    def report_cmd(out_path: str) -> None:
        write_html_report(collect_trial_report(registry, 3), out_path)
"""

from __future__ import annotations

from typing import Any

import click

report_output_option = click.option(
    "-o",
    "--output",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="HTML file to write.",
)


def write_html_report(report: Any, out_path: str) -> None:
    """Render ``report`` (from ``ckptstore.reports.collect_*``) to ``out_path`` and say so."""
    from ckptstore.reports import render_report, write_report

    write_report(render_report(report), out_path)
    click.echo(f"Wrote {out_path}")
