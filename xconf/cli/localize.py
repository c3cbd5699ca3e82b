"""`xconf localize RUN_DIR CASE_ID`: parse the arguments and draw the result.

The work is :mod:`xconf.localize.service`'s (also behind ``--localize`` after a run). Heavy
imports (torch, the engines) are deferred to the call: `xconf --help` stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only argparse at module level: `xconf --help` imports this module
    from rich.console import Console
    from rich.table import Table

    from xconf.localize.service import Localization, LocalizeFailure
    from xconf.session import AfterVerdict, Outcome


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "localize",
        help="score a case's frozen tokens again with taps on every module and report the "
        "first layer whose drift rises above the baseline's noise floor",
    )
    add_case_arguments(parser, "a case id from plan.jsonl (the verdict table shows it)")


def add_case_arguments(parser: Any, case_help: str) -> None:
    """The arguments of a command that works on one case of a sealed run (localize, fix)."""
    parser.add_argument("run_dir", type=Path, help="<output root>/<experiment_id>")
    parser.add_argument("case_id", help=case_help)
    parser.add_argument(
        "--runtime",
        default=None,
        help="runtime config (conf/runtime/NAME.yaml); default: the one the run used",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the engines' own output here instead of appending it to the run's xconf.log",
    )


def drift_table(document: dict[str, Any]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"drift by tap: case {document['case_id']} vs baseline floor "
        f"(diverges above {document['factor']:g}x floor)"
    )
    for column in ("tap", "relative diff", "floor", "x floor", ""):
        table.add_column(column, justify="left" if column == "tap" else "right")
    for row in document["taps"]:
        mark = Text("above", style="bold red") if row["above"] else Text("")
        table.add_row(
            row["label"],
            f"{row['case_relative']:.3g}",
            f"{row['floor']:.3g}",
            f"{row['ratio']:.3g}",
            mark,
        )
    return table


def show(result: Localization, console: Console) -> None:
    console.print(drift_table(result.document))
    console.print(f"wrote {result.path}")
    console.print(result.line, markup=False, highlight=False)


def after_verdict(
    localize: bool,
    on_result: Callable[[Localization | None], None],
    on_error: Callable[[LocalizeFailure], None],
) -> tuple[AfterVerdict, ...]:
    """The run's after-verdict hooks: with ``--localize`` (``localize=true``), every failing
    case localized and drawn (``on_result``) before the report is written; a case that
    cannot be localized is recorded and said (``on_error``), never silent."""
    if not localize:
        return ()
    from xconf.localize import service

    return (service.after_verdict(on_result, on_error),)


def step(args: argparse.Namespace, view: Any) -> Outcome:
    """`xconf localize`: one session step (coded errors become exit 2 in ``session.guarded``)."""
    from xconf.localize.service import localize_case
    from xconf.run_output import OutputPolicy
    from xconf.session import EXIT_OK, Outcome

    output = OutputPolicy(verbose=args.verbose, console=view.console)
    result = localize_case(args.run_dir, args.case_id, runtime=args.runtime, output=output)
    show(result, view.console)
    return Outcome(EXIT_OK)
