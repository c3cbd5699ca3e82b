"""A rich terminal summary that points at the written report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xconf.report.attribution import describe, more_drift, ordered
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
    """Print the counts, the verdict table (baseline, then the worst cases, then why each
    case without a verdict has none; ``table=False`` leaves it out), each intervention's
    effect against the baseline with its interval, the headline (a failing baseline first;
    the knob that moves drift most only when its interval supports it), and the report."""
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
        for case in data.cases:  # every non-verdict says why, here and not only on disk
            if case.result not in ("pass", "fail") and case.reason:
                label = (case.label, STYLES.get(case.result, ""))
                console.print(Text.assemble(label, f": {case.reason}"))
    if data.attribution:
        console.print(_effect_table(data))
    for line in data.headline.lines if data.headline else ():
        bold = line.startswith(("baseline fails", "most drift: ")) and "no knob" not in line
        console.print(Text(line, style="bold" if bold else ""))
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


def _effect_table(data: ReportData) -> Any:
    """Each intervention's mean |diff| against the baseline's on the same sequences, with the
    bootstrap interval: the numbers the headline is drawn from."""
    from rich.table import Table
    from rich.text import Text

    rows = ordered(data.attribution)
    first = next((r.effect for r in rows if r.effect is not None), None)
    scope = f" ({first.confidence:.0%} interval, {first.sequences} sequences)" if first else ""
    table = Table(
        title=Text(f"effect on mean |diff| against the baseline{scope}"),
        show_edge=False,
        header_style="bold dim",
        pad_edge=False,
    )
    # The full-vocabulary means (figures, never votes), where both sides kept their rows.
    vocab = any(r.kl_rollout_training is not None for r in rows)
    names: tuple[str, ...] = ("intervention", "result", "vs baseline", "max |diff|")
    names += ("KL(r‖t)", "KL(t‖r)", "TV", "top-10", "argmax") if vocab else ()
    for name in names:
        table.add_column(name, justify="left" if name in names[:3] else "right")
    for row in rows[:MAX_ROWS]:
        figures = (
            (
                sci(row.kl_rollout_training),
                sci(row.kl_training_rollout),
                sci(row.total_variation),
                _share(row.top10_overlap),
                _share(row.argmax_agreement),
            )
            if vocab
            else ()
        )
        table.add_row(
            Text(row.label),
            Text(row.result, style=STYLES.get(row.result, "")),
            Text(describe(row.effect), style="bold" if more_drift(row.effect) else "dim"),
            sci(row.max_abs_diff),
            *figures,
        )
    return table


def _share(value: float | None) -> str:
    """A mean overlap or agreement (0..1) to four places; a dash when there is none."""
    return "—" if value is None else f"{value:.4f}"
