"""`xconf report` glue, the rich terminal summary, and a light package import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from xconf.report.build import build_report
from xconf.report.cli import main_report
from xconf.report.terminal import render_terminal_summary
from xconf.report.writer import report_after_run


def test_default_output_is_html_in_the_run_dir(run_dir: Path, capsys) -> None:
    assert main_report([str(run_dir)]) == 0
    page = run_dir / "report.html"
    assert page.is_file() and page.read_text().startswith("<!DOCTYPE html>")
    assert oct(page.stat().st_mode & 0o777) == "0o644"
    assert "report:" in capsys.readouterr().err
    assert build_report(run_dir).cases[0].is_baseline  # a report file does not upset a re-read


def test_json_format_to_a_file_and_to_stdout(run_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    assert main_report([str(run_dir), "--format", "json", "-o", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["experiment_id"] == "exp-report"
    assert main_report([str(run_dir), "-o", "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "xconf.report.v1"
    assert main_report([str(run_dir), "-o", str(tmp_path / "auto.json"), "--quiet"]) == 0
    assert json.loads((tmp_path / "auto.json").read_text())["schema"] == "xconf.report.v1"


def test_bad_run_dir_exits_2_with_a_coded_error(tmp_path: Path, capsys) -> None:
    assert main_report([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "[report.bad_run_dir]" in err and str(tmp_path / "nope") in err


def test_bad_format_is_a_usage_error(run_dir: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main_report([str(run_dir), "--format", "pdf"])
    assert info.value.code == 2


def test_terminal_summary_points_at_the_report(run_dir: Path) -> None:
    console = Console(record=True, width=160)
    render_terminal_summary(build_report(run_dir), console, run_dir / "report.html")
    text = console.export_text()
    assert "exp-report" in text and "2 fail" in text
    assert "logp.backend=smoke_only.logp_offset" in text
    assert "most drift: logp.backend" in text
    assert f"report: {run_dir / 'report.html'}" in text
    assert "attempt(s) without a verified seal" in text


def test_importing_the_report_package_loads_no_plotting_or_templating() -> None:
    code = (
        "import sys, xconf.report, xconf.report.build, xconf.report.cli;"
        "bad = [m for m in ('matplotlib', 'jinja2') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_report_after_run_writes_and_points_without_a_second_table(run_dir: Path) -> None:
    console = Console(record=True, width=160)
    written = report_after_run(run_dir, console)
    assert written is not None and written.path == run_dir / "report.html"
    assert written.path.is_file()
    text = console.export_text()
    assert f"report: {written.path}" in text and "2 fail" in text
    assert "k3_kl" not in text  # the run printed its own verdict table


def test_report_after_run_never_raises(tmp_path: Path) -> None:
    console = Console(record=True, width=160)
    assert report_after_run(tmp_path / "missing", console) is None
    assert "report not written [report.bad_run_dir]" in console.export_text()
