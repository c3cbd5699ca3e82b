"""`xconf fix RUN_DIR CASE_ID`: parse the arguments and draw the search.

The work is :mod:`xconf.fix.service`'s (also behind ``fix=true`` on ``xconf-run``). Heavy
imports are deferred to the call: `xconf --help` stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xconf.cli.localize import add_case_arguments

if TYPE_CHECKING:  # only argparse at module level: `xconf --help` imports this module
    from rich.console import Console
    from rich.text import Text

    from xconf.fix.service import FixFailure, FixResult, StepOutcome
    from xconf.session import AfterVerdict, Outcome


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "fix",
        help="find the replacement arms that make a failing case pass: each tried as a sealed "
        "case of the run, from the case's first divergent module on; ends with a verified fix "
        "or what the full arm leaves",
    )
    add_case_arguments(parser, "a failing case id from plan.jsonl (the verdict table)")


def step_line(outcome: StepOutcome) -> Text:
    from rich.text import Text

    e = outcome.evidence
    style = "green" if e.verified else ("red" if e.result == "fail" else "yellow")
    text = Text(f"{outcome.case_id}  {outcome.step.label}  ")
    text.append(e.result, style=style)
    text.append(
        f"  {e.mismatches} of {e.active} over, {e.bitwise} bitwise, drift {e.effect_text}"
        " against the failing case"
    )
    if e.not_read_back:
        text.append(f"  (not read back: {', '.join(e.not_read_back)})", style="yellow")
    if e.result not in ("pass", "fail") and e.reason:
        text.append(f"  {e.reason}", style="yellow")
    return text


def show(result: FixResult, console: Console) -> None:
    from rich.text import Text

    start = result.document["start"]
    where = start.get("tap") or "no module"
    console.print(
        Text(
            f"fix {result.document['case_id']} ({result.document['label']}): first divergence "
            f"at {where}, arms from {start['kind']} on"
        )
    )
    for note in result.document["notes"]:
        console.print(Text(f"note: {note}", style="dim"))
    console.print(Text(f"wrote {result.path}"))
    console.print(Text(result.line, style="bold green" if result.verified else "bold red"))


def after_verdict(
    fix: bool,
    console: Console,
    on_error: Callable[[FixFailure], None] | None = None,
) -> tuple[AfterVerdict, ...]:
    """The run's after-verdict hook for ``fix=true``: the fix search of a failing baseline,
    each case drawn as it ends, then the closing line."""
    if not fix:
        return ()
    from xconf.fix import service

    def on_result(result: FixResult | None) -> None:
        if result is None:
            console.print("fix: the baseline does not fail; nothing to fix")
            return
        show(result, console)

    def failed(failure: FixFailure) -> None:
        from rich.text import Text

        console.print(Text(failure.line, style="yellow"))

    return (
        service.after_verdict(lambda o: console.print(step_line(o)), on_result, on_error or failed),
    )


def step(args: argparse.Namespace, view: Any) -> Outcome:
    """`xconf fix`: one session step (coded errors become exit 2 in ``session.guarded``).
    Exit 0 with a verified fix, 1 when no arm removes the drift."""
    from xconf.fix.service import fix_case
    from xconf.run_output import OutputPolicy
    from xconf.session import EXIT_NON_PASS, EXIT_OK, Outcome

    output = OutputPolicy(verbose=args.verbose, console=view.console)
    result = fix_case(
        args.run_dir,
        args.case_id,
        runtime=args.runtime,
        output=output,
        on_step=lambda o: view.console.print(step_line(o)),
    )
    show(result, view.console)
    return Outcome(EXIT_OK if result.verified else EXIT_NON_PASS)
