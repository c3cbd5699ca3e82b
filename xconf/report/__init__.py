"""The drift report: one self-contained HTML page (or JSON) per run directory.

Importing this package is cheap: matplotlib and jinja2 load only when HTML is rendered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "ReportData",
    "ReportError",
    "WrittenReport",
    "build_report",
    "main_report",
    "render_terminal_summary",
    "report_after_run",
    "write_report",
]

if TYPE_CHECKING:
    from xconf.report.build import build_report
    from xconf.report.cli import main_report
    from xconf.report.errors import ReportError
    from xconf.report.model import ReportData
    from xconf.report.terminal import render_terminal_summary
    from xconf.report.writer import WrittenReport, report_after_run, write_report

_WHERE = {
    "ReportData": "xconf.report.model",
    "ReportError": "xconf.report.errors",
    "WrittenReport": "xconf.report.writer",
    "build_report": "xconf.report.build",
    "main_report": "xconf.report.cli",
    "render_terminal_summary": "xconf.report.terminal",
    "write_report": "xconf.report.writer",
    "report_after_run": "xconf.report.writer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'xconf.report' has no attribute {name!r}")
