"""Self-contained HTML reports of trials and experiments (metric curves, hyperparameters,
checkpoints), rendered without JavaScript or external files.

Example::

    from ckptstore.registry import Registry
    from ckptstore.reports import collect_experiment_report, render_report, write_report

    report = collect_experiment_report(Registry("sqlite:///reg.db"), 1)
    write_report(render_report(report), "report.html")
"""

from ckptstore.reports.data import collect_experiment_report, collect_trial_report
from ckptstore.reports.html import render_report, write_report

__all__ = ["collect_experiment_report", "collect_trial_report", "render_report", "write_report"]
