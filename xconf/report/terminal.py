"""A rich terminal summary that points at the written report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xconf.report.model import RESULTS, ReportData
from xconf.report.stats import percent, sci

STYLES = {
    "pass": "bold green",
    "fail": "bold red",
    "zero_active_tokens": "bold yellow",
    "invalid_artifact": "bold magenta",
    "invalid_identity": "bold magenta",
    "error": "bold white on red",
    "not_run": "dim",
}
MAX_ROWS = 12
NARROW = 120


def render_terminal_summary(
    data: ReportData,
    console: Any,
    report_path: str | Path | None = None,
    *,
    table: bool = True,
) -> None:
    """Print the counts, the verdict table (baseline, then the worst cases; ``table=False``
    leaves it out), the knob that moves drift most, and where the report is."""
    from rich.text import Text

    counts = Text()
    for result in RESULTS:
        if data.counts.get(result):
            counts.append(f" {data.counts[result]} {result} ", style=STYLES[result])
            counts.append(" ")
    console.print(
        Text(f"xconf · {data.experiment_id} · {len(data.cases)} cases ", style="bold"), counts
    )
    if table:
        console.print(_verdict_table(data, console.width < NARROW))
        if len(data.cases) > MAX_ROWS:
            more = len(data.cases) - MAX_ROWS
            console.print(Text(f"… {more} more cases in the report", style="dim"))
    if data.knob_ranking:
        top = data.knob_ranking[0]
        console.print(
            Text.assemble(
                ("most drift: ", "dim"),
                (top.knob, "bold"),
                f"  max |diff| {sci(top.max_abs_diff)}, mismatches {percent(top.mismatch_ratio)}",
            )
        )
    unverified = sum(1 for c in data.cases for a in c.attempts if not a.seal_verified)
    if unverified:
        console.print(
            Text(f"{unverified} attempt(s) without a verified seal were ignored", style="yellow")
        )
    if report_path is not None:
        console.print(Text.assemble(("report: ", "dim"), (str(report_path), "bold underline")))


def _verdict_table(data: ReportData, narrow: bool) -> Any:
    """The first rows of the verdict table; ``narrow``: short case ids, no k3_kl."""
    from rich.table import Table
    from rich.text import Text

    table = Table(show_edge=False, header_style="bold dim", pad_edge=False)
    table.add_column("case", no_wrap=True)
    table.add_column("changed", overflow="fold")
    table.add_column("result", no_wrap=True)
    numbers = ("active", "mism.", "ratio", "max |diff|") + (() if narrow else ("k3_kl",))
    for name in numbers:
        table.add_column(name, justify="right", no_wrap=True)
    for case in data.cases[:MAX_ROWS]:
        row: list[str | Text] = [
            Text(case.case_id[:10] if narrow else case.case_id),  # verbatim, never markup
            Text(
                "baseline"
                if case.is_baseline
                else case.label
                + ("" if case.intervention_applied else " (intervention not applied)")
            ),
            Text(case.result, style=STYLES.get(case.result, "")),
            "—" if case.active_tokens is None else str(case.active_tokens),
            "—" if case.mismatches is None else str(case.mismatches),
            percent(case.mismatch_ratio),
            sci(case.diff.max),
        ]
        table.add_row(*row, *(() if narrow else (sci(case.approx_kl),)))
    return table
