"""Typed errors of the drift report."""

from __future__ import annotations

from xconf.errors import XconfError


class ReportError(XconfError):
    """The run directory cannot be read into a report, or the report cannot be written.

    Codes: ``report.bad_run_dir`` (missing, not a directory, a symlink, or no
    ``experiment.json``), ``report.bad_header`` (``experiment.json`` unreadable),
    ``report.bad_plan`` (``plan.jsonl`` unreadable), ``report.bad_format`` (unknown
    output format), ``report.write_failed`` (the output could not be written),
    ``report.missing_dependency`` (matplotlib or jinja2 not installed).
    """
