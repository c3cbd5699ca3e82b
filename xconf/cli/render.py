"""Terminal output: progress while cases run, then the verdict table."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from xconf.shown_text import console

if TYPE_CHECKING:
    from xconf.case_record import CaseRecord, RunStep, RunSummary
    from xconf.execution_plan import ExecutionPlan
    from xconf.localize.service import Localization, LocalizeFailure
    from xconf.session import Prepared, RunProgress

RESULT_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "zero_active_tokens": "yellow",
    "invalid_artifact": "magenta",
    "invalid_identity": "magenta",
    "error": "red",
}


def make_console() -> Console:
    """A console wide enough for the verdict table when output is a pipe or a CI log.

    Markup is off: everything printed as a string (paths, ids, knob values, runtime error
    messages, directory entries) is shown verbatim, so ``[/dev/nvidia0]`` or ``[link=...]``
    can neither raise ``MarkupError`` nor vanish. Styles are applied with ``Text`` only.
    Control and bidi characters in any of them are shown escaped (``xconf.shown_text``).
    """
    probe = console()
    return probe if probe.is_terminal else console(width=160)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3e}"


def plan_table(execution: ExecutionPlan) -> Text:
    spec = execution.plan.spec
    rows = []
    for row in (c.to_row() for c in execution.cases):
        changed = ", ".join(f"{k}={v}" for k, v in row["changed"].items()) or "baseline"
        rows.append(
            (
                str(row["index"]),
                row["case_id"],
                row["kind"],
                changed,
                row["operators"]["rollout"],
                row["operators"]["training"],
            )
        )
    return grid(
        f"plan {spec.experiment_id}: {len(execution.cases)} cases "
        f"({spec.strategy}, scenario {spec.scenario.level})",
        ("#", "case", "kind", "changed knob", "rollout logp", "training logp"),
        rows,
    )


def grid(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Text:
    """A boxed table as one ``Text``, cells verbatim (never markup).

    rich's ``Table`` measures and wraps every cell: 0.4 s for a 256-case plan, most of
    `xconf plan`'s budget. Plan cells are short identifiers, so fixed columns are exact.
    """
    b = box.HEAVY_HEAD
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def rule(left: str, cross: str, right: str, fill: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right

    def cells(values: Sequence[str], left: str, sep: str, right: str) -> str:
        return left + sep.join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + right

    top = rule(b.top_left, b.top_divider, b.top_right, b.top)
    text = Text(title.center(len(top)).rstrip() + "\n", style="italic")
    text.append(top + "\n")
    text.append(cells(header, b.head_left, b.head_vertical, b.head_right) + "\n", style="bold")
    text.append(
        rule(b.head_row_left, b.head_row_cross, b.head_row_right, b.head_row_horizontal) + "\n"
    )
    body = [cells(r, b.mid_left, b.mid_vertical, b.mid_right) for r in rows]
    text.append("".join(line + "\n" for line in body))
    text.append(rule(b.bottom_left, b.bottom_divider, b.bottom_right, b.bottom))
    text.no_wrap = True
    return text


def verdict_table(summary: RunSummary) -> Table:
    table = Table(
        title=Text(
            f"{summary.experiment_id}: {len(summary.records)} cases, "
            f"engines built {summary.engines_built}, reused {summary.engines_reused}"
        )
    )
    for column in (
        "case",
        "changed knob",
        "result",
        "active",
        "mismatches",
        "max |diff|",
        "p99",
        "attempt",
    ):
        table.add_column(column, justify="right" if column in ("active", "mismatches") else "left")
    for r in summary.records:
        style = RESULT_STYLE.get(r.result, "")
        attempt = f"{r.attempt_id} ({'reused' if r.reused else 'new'})"
        table.add_row(
            Text(r.case_id),
            Text(r.label + _applied_note(r)),
            Text(r.result, style=style),
            Text(str(r.active_tokens)),
            Text(str(r.mismatches)),
            Text(_fmt(r.max_abs_diff)),
            Text(_fmt(r.p99_abs_diff)),
            Text(attempt),
        )
    return table


def _applied_note(r: CaseRecord) -> str:
    if r.confounded:
        return f" (confounded: {', '.join(r.confounded)} not run as set)"
    return "" if r.intervention_applied else " (intervention not applied)"


def print_reasons(console: Console, records: list[CaseRecord]) -> None:
    for r in records:
        if r.result not in ("pass", "fail") and r.reason:
            console.print(Text.assemble((r.label, RESULT_STYLE.get(r.result, "")), f": {r.reason}"))


# A step between cases (an engine built, the identity frozen) that a log shows a line for.
LONG_STEP_S = 10.0


def case_line(record: CaseRecord, done: int, total: int, seconds: float) -> Text:
    """One finished case, for a log: its place, id, knob, result and wall time."""
    width = len(str(total))
    how = "reused" if record.reused else "new"
    return Text.assemble(
        f"[{done:>{width}}/{total}] {record.case_id}  {record.label}{_applied_note(record)}  ",
        (record.result, RESULT_STYLE.get(record.result, "")),
        f"  {seconds:.1f} s ({record.attempt_id} {how})",
    )


@contextmanager
def case_progress(console: Console, total: int) -> Iterator[RunProgress]:
    """A rich progress bar on a terminal; anywhere else (a pipe, ``make run > log``) one
    line per finished case and one per step between cases that took over
    :data:`LONG_STEP_S`, each printed as it happens."""
    from xconf.session import RunProgress

    if not console.is_terminal:
        since = [time.perf_counter()]  # a case's time: since the case before it finished
        done = [0]

        def case_done(record: CaseRecord) -> None:
            now = time.perf_counter()
            done[0] += 1
            console.print(case_line(record, done[0], total, now - since[0]))
            since[0] = now

        def step(step: RunStep) -> None:
            if step.kind == "identity":
                since[0] = time.perf_counter()  # the first case starts once it is frozen
            if step.seconds > LONG_STEP_S:
                indent = " " * (2 * len(str(total)) + 4)  # aligned with the case ids above
                console.print(Text(f"{indent}{step.what} in {step.seconds:.1f} s"))

        yield RunProgress(case_done, step)
        return
    progress = Progress(
        TextColumn("[bold]scoring cases"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}", markup=False),  # labels and results: verbatim
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task("", total=total)

        def on_case(record: CaseRecord) -> None:
            progress.update(task, advance=1, description=f"{record.label}: {record.result}")

        yield RunProgress(on_case, lambda step: None)


class ConsoleView:
    """The terminal side of :mod:`xconf.session`'s flow (its ``View``)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()

    def planned(self, prepared: Prepared, note: str) -> None:
        self.console.print(plan_table(prepared.execution))
        from xconf.planner import same_as_baseline

        for path, value in same_as_baseline(prepared.execution.plan):
            self.console.print(
                Text(
                    f"intervention {path}={value} equals the baseline: "
                    "no case of its own, the baseline case covers it",
                    style="yellow",
                )
            )
        self.console.print(Text(f"wrote {prepared.store.path / 'plan.jsonl'}{note}"))

    def progress(self, total: int) -> AbstractContextManager[RunProgress]:
        return case_progress(self.console, total)

    def verdict(self, summary: RunSummary) -> None:
        self.console.print(verdict_table(summary))
        print_reasons(self.console, summary.records)
        self.console.print(Text(f"artifacts: {summary.experiment_dir}"))

    def localized(self, result: Localization | None) -> None:
        if result is None:
            self.console.print("localize: no failing case")
            return
        from xconf.cli.localize import show

        show(result, self.console)

    def localize_failed(self, failure: LocalizeFailure) -> None:
        # On xconf's own console: stderr is the run log while engines run (run_output).
        self.console.print(Text(failure.line, style="yellow"))
        if failure.path is not None:
            self.console.print(Text(f"recorded in {failure.path}", style="dim"))
        elif failure.record_error is not None:
            err = failure.record_error
            self.console.print(Text(f"not recorded: [{err.code}] {err.message}", style="red"))
