"""The drift report: one self-contained HTML page (or JSON) per run directory.

Entry points: ``xconf.report.writer`` (``write_report``, ``report_after_run``),
``xconf.report.build`` (``build_report``) and ``xconf.report.cli`` (``main_report``).
matplotlib and jinja2 load only when HTML is rendered.
"""
