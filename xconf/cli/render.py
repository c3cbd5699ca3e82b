"""Terminal output: progress while cases run, then the verdict table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from xconf.execution_plan import ExecutionPlan
    from xconf.runner import CaseRecord, RunSummary
    from xconf.session import Prepared

RESULT_STYLE = {
    "pass": "green",
    "fail": "bold red",
    "zero_active_tokens": "yellow",
    "invalid_artifact": "magenta",
    "invalid_identity": "magenta",
    "error": "red",
}


def make_console() -> Console:
    """A console wide enough for the verdict table when output is a pipe or a CI log."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=160)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3e}"


def plan_table(execution: ExecutionPlan) -> Table:
    spec = execution.plan.spec
    table = Table(
        title=f"plan {spec.experiment_id}: {len(execution.cases)} cases "
        f"({spec.strategy}, scenario {spec.scenario.level})"
    )
    for column in ("#", "case", "kind", "changed knob", "rollout logp", "training logp"):
        table.add_column(column)
    for row in (c.to_row() for c in execution.cases):
        changed = ", ".join(f"{k}={v}" for k, v in row["changed"].items()) or "baseline"
        table.add_row(
            str(row["index"]),
            row["case_id"],
            row["kind"],
            changed,
            row["operators"]["rollout"],
            row["operators"]["training"],
        )
    return table


def verdict_table(summary: RunSummary) -> Table:
    table = Table(
        title=f"{summary.experiment_id}: {len(summary.records)} cases, "
        f"engines built {summary.engines_built}, reused {summary.engines_reused}"
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
            r.case_id,
            r.label + ("" if r.intervention_applied else " (intervention not applied)"),
            f"[{style}]{r.result}[/]",
            str(r.active_tokens),
            str(r.mismatches),
            _fmt(r.max_abs_diff),
            _fmt(r.p99_abs_diff),
            attempt,
        )
    return table


def print_reasons(console: Console, records: list[CaseRecord]) -> None:
    for r in records:
        if r.result not in ("pass", "fail") and r.reason:
            console.print(f"[{RESULT_STYLE.get(r.result, '')}]{r.label}[/]: {r.reason}")


@contextmanager
def case_progress(console: Console, total: int) -> Iterator[Any]:
    """Yields an ``on_case`` callback that advances a rich progress bar."""
    progress = Progress(
        TextColumn("[bold]scoring cases"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task("", total=total)

        def on_case(record: CaseRecord) -> None:
            progress.update(task, advance=1, description=f"{record.label}: {record.result}")

        yield on_case


class ConsoleView:
    """The terminal side of :mod:`xconf.session`'s flow (its ``View``)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()

    def planned(self, prepared: Prepared, note: str) -> None:
        self.console.print(plan_table(prepared.execution))
        from xconf.planner import same_as_baseline

        for path, value in same_as_baseline(prepared.execution.plan):
            self.console.print(
                f"[yellow]intervention {path}={value} equals the baseline:[/] "
                "no case of its own, the baseline case covers it"
            )
        self.console.print(f"wrote {prepared.store.path / 'plan.jsonl'}{note}")

    def progress(self, total: int) -> AbstractContextManager[Callable[[CaseRecord], None]]:
        return case_progress(self.console, total)

    def verdict(self, summary: RunSummary) -> None:
        self.console.print(verdict_table(summary))
        print_reasons(self.console, summary.records)
        self.console.print(f"artifacts: {summary.experiment_dir}")
